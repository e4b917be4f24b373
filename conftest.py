"""Loaded by every pytest run here, tests and notebooks alike: the learner's data folder points at a
temporary one, set at import time so nbval's kernels inherit it, and no run ever writes the real
user's progress file."""

import atexit
import os
import shutil
import tempfile

os.environ["SMALLEM_HOME"] = tempfile.mkdtemp(prefix="smallem-test-home-")
atexit.register(shutil.rmtree, os.environ["SMALLEM_HOME"], ignore_errors=True)
