import subprocess
import sys

import pytest

from app import __version__
from app.cli import main


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"vlchat {__version__}"


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "app.cli", "--help"], capture_output=True, text=True, check=True)
    assert "serve" in out.stdout and "chat" in out.stdout
