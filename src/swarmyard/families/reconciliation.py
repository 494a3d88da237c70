"""The reconciliation family (the seed's live benchmark): find the records two sources disagree on.

A ledger and a bank statement hold the same payments; 15 records were made inconsistent (an amount, a date or
an account differs, or the record is missing from one side). Both sources are split into 10 shards, one task
each: a worker compares its shard's ``task/ledger.csv`` and ``task/bank.csv`` in its machine, posts one progress
note and submits a finding naming the inconsistent record ids; the lead merges them into one sorted,
de-duplicated list. Score = F1 of the ids named x 1,000,000 (``scorers/reconciliation.py``). The search split
judges the records of five shards chosen by the seed, the holdout all of them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import date, timedelta

from swarmyard.families.instance import Instance, TaskInput

NAME = "reconciliation"
SHARDS = 10
RECORDS_PER_SHARD = 40
INCONSISTENT = 15
KINDS = ("amount", "date", "account", "missing_from_bank", "missing_from_ledger")
_ACCOUNTS = tuple(f"ACC-{n:03d}" for n in (101, 102, 205, 310, 311, 420, 512, 640))
HEADER = "id,date,account,amount"

OBJECTIVE = ("Reconcile a ledger against a bank statement: list every record id whose fields differ between the "
             "two sources or that is in only one of them, as one sorted list without duplicates.")
PROMPT = ("Your shard of both sources is in your machine: task/ledger.csv and task/bank.csv (columns "
          f"{HEADER}). Compare them (with the shell, or the tools you are given): a record is inconsistent when its date, account or amount "
          "differs between the two files, or when its id is in only one of them. Post one short progress note "
          "on the board, then submit a finding whose body lists the inconsistent record ids of your shard, one "
          "per line (write 'none' if there are none).")
LEAD_PROMPT = ("Merge the inconsistent record ids the findings list into one sorted list without duplicates, "
               "one id per line, and submit it as the synthesis.")


@dataclass(frozen=True, slots=True)
class Record:
    """One payment as a source shows it."""

    id: str
    day: date
    account: str
    cents: int

    def line(self) -> str:
        """The record as a CSV row."""
        return f"{self.id},{self.day.isoformat()},{self.account},{self.cents // 100}.{self.cents % 100:02d}"


def _altered(record: Record, kind: str, rng: random.Random) -> Record:
    if kind == "amount":
        return Record(record.id, record.day, record.account, record.cents + rng.choice((-1, 1)) * rng.randint(1, 5000))
    if kind == "date":
        return Record(record.id, record.day + timedelta(days=rng.choice((-1, 1)) * rng.randint(1, 9)),
                      record.account, record.cents)
    other = rng.choice([a for a in _ACCOUNTS if a != record.account])
    return Record(record.id, record.day, other, record.cents)


def generate(seed: int) -> Instance:
    """The instance of ``seed``: the same seed gives the same files, byte for byte."""
    rng = random.Random(f"{NAME}:{seed}")
    total = SHARDS * RECORDS_PER_SHARD
    ids = [f"TX-{n:05d}" for n in rng.sample(range(10000, 100000), total)]
    start = date(2025, 1, 1)
    records = [Record(i, start + timedelta(days=rng.randrange(365)), rng.choice(_ACCOUNTS),
                      rng.randint(100, 500_000)) for i in ids]
    bad = rng.sample(range(total), INCONSISTENT)
    # every kind at least twice, the rest at random: a worker meets each way two sources can disagree
    kinds = [KINDS[i % len(KINDS)] for i in range(2 * len(KINDS))]
    kinds += [rng.choice(KINDS) for _ in range(INCONSISTENT - len(kinds))]
    rng.shuffle(kinds)
    ledger: list[Record | None] = list(records)
    bank: list[Record | None] = list(records)
    for index, kind in zip(bad, kinds, strict=True):
        if kind == "missing_from_bank":
            bank[index] = None
        elif kind == "missing_from_ledger":
            ledger[index] = None
        else:
            bank[index] = _altered(records[index], kind, rng)
    order = list(range(total))
    rng.shuffle(order)
    tasks = []
    shard_ids: list[list[str]] = []
    for shard in range(SHARDS):
        members = order[shard * RECORDS_PER_SHARD:(shard + 1) * RECORDS_PER_SHARD]
        shard_ids.append([ids[i] for i in members])
        files = {}
        for name, source in (("ledger.csv", ledger), ("bank.csv", bank)):
            rows = [r.line() for i in members if (r := source[i]) is not None]
            rng.shuffle(rows)
            files[name] = "\n".join([HEADER, *rows]) + "\n"
        tasks.append(TaskInput(f"shard {shard + 1:02d}", PROMPT, files, f"shard-{shard + 1:02d}"))
    inconsistent = sorted(ids[i] for i in bad)
    searched = sorted(rng.sample(range(SHARDS), SHARDS // 2))
    search_universe = sorted(i for shard in searched for i in shard_ids[shard])

    def truth(universe: list[str]) -> str:
        judged = set(universe)
        return json.dumps({"universe": universe, "inconsistent": [i for i in inconsistent if i in judged]},
                          indent=0) + "\n"

    return Instance(
        NAME, seed, OBJECTIVE, tuple(tasks), "reconciliation",
        search={"truth.json": truth(search_universe)},
        holdout={"truth.json": truth(sorted(ids))},
        lead_prompt=LEAD_PROMPT,
    )


def answer(seed: int) -> list[str]:
    """The inconsistent record ids of ``seed``, sorted: what a perfect run submits (for tests and oracles)."""
    return list(json.loads(generate(seed).holdout["truth.json"])["inconsistent"])
