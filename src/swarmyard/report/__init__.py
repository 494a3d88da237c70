"""Run reports: ``runs/<id>/report.md`` and ``report.html`` with findings, board, charts and totals."""

from swarmyard.report.data import ReportData, RunScores, ScorePoint, WorkerSpan
from swarmyard.report.render import ReportFiles, write_report

__all__ = ["ReportData", "ReportFiles", "RunScores", "ScorePoint", "WorkerSpan", "write_report"]
