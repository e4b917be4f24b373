"""Lesson 15's recorder lives in its lesson's folder (smallem/course/l15_memory/record.py); this
entry runs it for benchmarks/memory_device_round2.sh. Run: `python3 benchmarks/memory_record_gpu.py [DIR]`
(or `python3 -m smallem.course.l15_memory.record [DIR]`)."""

import runpy

runpy.run_module("smallem.course.l15_memory.record", run_name="__main__", alter_sys=True)
