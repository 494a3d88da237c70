"""The isolated evaluator: signed integer scores for artifacts, and a holdout that answers once per goal.

Public names: ``load_bundle``, ``Evaluator``, ``SignedScore``, ``verify_score``, ``EvaluatorClient``,
``AsyncEvaluatorClient``. Import them from their modules; this package imports nothing at import time.
"""
