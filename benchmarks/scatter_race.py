"""Notebook 09's GPU cell, run alone: a plain and an atomic scatter-add kernel on the same
repeated rows; prints the JSON that lesson 09's byhand.RECORDED_SCATTER_RACE records
(smallem/course/l09_backprop_by_hand/byhand.py).

    python benchmarks/scatter_race.py [JSON]
"""

import json
import sys

from smallem.course.l09_backprop_by_hand import byhand
from smallem.data import BatchSampler, load_corpus

tokens = BatchSampler(load_corpus().train, batch=256, seed=2).next()[0]  # notebook 09's batch
race = byhand.scatter_add_race(tokens, 257)
print(json.dumps(race, indent=1))
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as fh:
        json.dump(race, fh, indent=1)
