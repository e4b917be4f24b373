"""The commands of `smallem` and their options, as names only: what the command line checks
`--version` and a mistyped command or option against before it loads anything heavy (NumPy and
the training stack take a second, many on a busy machine). parser.py builds the options
themselves; tests/test_cli_edges.py checks that these names are the parser's.
"""

_OPTIONS = {  # --help and -h besides, on every command
    "gradcheck": "backend precision",
    "train": "accumulate attention backend batch capture checkpoint-blocks clip context corpus "
             "eval-every heads health health-every json layers log-every lr merges model "
             "no-capture no-checkpoint-blocks optimizer precision ranks resume save seed steps "
             "threads tokens vocab weight-decay width",
    "sample": "backend bytes checkpoint prompt seed temperature",
    "checks": "backend corpus merges model tokens vocab",
    "bench": "attention batch block corpus json model no-cpu64 no-torch precision ranks sizes "
             "steps threads warmup",
    "figures": "backend batch corpus only out steps",
    "notebooks": "",
}
OPTIONS: dict[str, tuple[str, ...]] = {
    command: tuple(f"--{name}" for name in names.split()) + ("--help",)
    for command, names in _OPTIONS.items()}
