"""Matched campaigns: the same problem, cap and seeds for every cell (single worker vs cohort, scored history vs
single-draft refinement, best@n vs team@n), each trial a real run, with bootstrap intervals over the seeds."""

from swarmyard.campaign.runner import TrialEvent, run_campaign
from swarmyard.campaign.spec import Campaign, Cell, Trial, load_campaign
from swarmyard.campaign.summary import CampaignSummary, summarise

__all__ = ["Campaign", "CampaignSummary", "Cell", "Trial", "TrialEvent", "load_campaign", "run_campaign",
           "summarise"]
