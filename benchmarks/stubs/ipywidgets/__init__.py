"""A stand-in for ipywidgets on a machine without it (the device image has none): the lesson
modules' widget classes can be defined, so `import smallem` works for GPU runs; building a
widget raises. gpu_round3.sh puts this on the path only when ipywidgets cannot be imported."""


class _Widget:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("ipywidgets is not installed here: this is benchmarks/stubs' stand-in")


def __getattr__(name):
    return _Widget
