"""Matched campaigns: the same problem and seeds for every cell (single worker vs cohort, scored history vs
single-draft refinement, best@n vs team@n), matched on budget, tokens or calls, each trial a real run; cells compared
seed by seed (paired bootstrap interval, exact sign and Wilcoxon tests) and conclusions drawn from those."""

from swarmyard.campaign.runner import TrialEvent, run_campaign
from swarmyard.campaign.spec import Campaign, Cell, Trial, load_campaign
from swarmyard.campaign.summary import CampaignSummary, summarise

__all__ = ["Campaign", "CampaignSummary", "Cell", "Trial", "TrialEvent", "load_campaign", "run_campaign",
           "summarise"]
