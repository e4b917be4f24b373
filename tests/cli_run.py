"""What the command-line tests share: `run` calls `smallem ARGV` in this process and returns
(status, stdout, stderr); `one_line_error` says whether stderr is one `smallem ...` sentence."""

from smallem.tools.cli import main


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err):
    lines = err.strip().splitlines()
    return len(lines) == 1 and "Traceback" not in err and lines[0].startswith("smallem ")
