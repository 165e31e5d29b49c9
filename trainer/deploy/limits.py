"""A bound on the memory that decoding images may take at once in the server process.

A task's ``Preprocessing`` with a ``cost(items)`` (decoded pixels, read from the
image headers without decoding) is decoded inside :meth:`PixelBudget.hold`:
requests whose images together exceed what is free wait their turn, so at most
``total`` pixels are decoded at any moment, whatever the number of clients. A
request costing more than the whole budget is refused at once (413).
"""

from __future__ import annotations

import asyncio
import contextlib

from .payload import BadRequest


class PixelBudget:
    def __init__(self, total: int):
        self.total = total
        self.used = 0
        self._freed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, pixels: int):
        if pixels > self.total:
            raise BadRequest(f"the request's images hold {pixels} pixels together, over the server's decode budget "
                             f"of {self.total} (--max_decode_pixels): send fewer or smaller images per request", 413)
        async with self._freed:
            await self._freed.wait_for(lambda: self.used + pixels <= self.total)
            self.used += pixels
        try:
            yield
        finally:
            async with self._freed:
                self.used -= pixels
                self._freed.notify_all()
