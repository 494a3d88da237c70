"""Scoring programs copied verbatim into the generated bundles: stdlib only, one file each, run by the
evaluator's sandbox as ``python3 score.py ARTIFACT DATA_DIR`` and printing one integer."""
