"""``ptrain predict`` on the digits model warns when an image is a dark digit on white paper."""

import logging

from PIL import Image

from models.resnet.data import render_digits
from models.resnet.predict import check_digit_polarity


def test_an_inverted_digit_is_reported_a_training_like_one_is_not(caplog):
    images, _ = render_digits(32)
    white_on_black = Image.fromarray(images[0])
    black_on_white = Image.fromarray(255 - images[0])
    with caplog.at_level(logging.WARNING, logger="models.resnet"):
        assert check_digit_polarity(white_on_black, "ok.png")
        assert not caplog.records
        assert not check_digit_polarity(black_on_white, "paper.png")
    (record,) = caplog.records
    assert "paper.png looks inverted" in record.getMessage()
    assert "white digit on a black background" in record.getMessage()


def test_every_embedded_digit_passes_the_check():
    images, _ = render_digits(16)
    assert all(check_digit_polarity(Image.fromarray(im), "x") for im in images)
