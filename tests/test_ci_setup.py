"""``.ci/setup`` as a new user's machine meets it, with stand-ins for python, pip, apt-get and sudo that record
their calls: torch comes from PyTorch's CPU index first and from the default index only where that fails;
Chromium is installed with a word on what and why, and where it cannot be (no apt-get, no sudo, apt-get fails)
setup says so and goes on."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TOOLS = ("bash", "dirname", "mktemp", "tail", "sed", "rm", "cat", "sha256sum", "cut", "mkdir", "chmod", "cp")

PYTHON_STUB = """#!/usr/bin/env bash
echo "python $*" >> "$STUB_LOG"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && echo ': # stand-in' > "$3/bin/activate" && cp "$0" "$3/bin/python" && exit 0
fi
if [ "$1" = "-" ]; then cat > /dev/null; [ "${STUB_INDEX_UP:-1}" = 1 ]; exit $?; fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  case " $* " in *" --index-url "*) [ "${STUB_CPU_PIP_FAILS:-0}" = 1 ] && exit 1 ;; esac
  exit 0
fi
exit 0
"""
APT_STUB = """#!/usr/bin/env bash
echo "apt-get $*" >> "$STUB_LOG"
if [ "${STUB_APT_FAILS:-0}" = 1 ]; then echo "E: Unable to locate package chromium" >&2; exit 100; fi
"""
SUDO_STUB = """#!/usr/bin/env bash
echo "sudo $*" >> "$STUB_LOG"
[ "$1" = "-n" ] && shift
exec "$@"
"""


def run_setup(tmp_path, *, root=True, apt=True, sudo=True, **env_flags):
    """Run a copy of .ci/setup in a fresh folder with the stand-ins on PATH (and nothing else: no real Chromium,
    no real apt-get); returns ``(returncode, output, calls)``."""
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    (repo / ".ci").mkdir(parents=True)
    bin_.mkdir()
    shutil.copy(ROOT / ".ci" / "setup", repo / ".ci" / "setup")
    (repo / "requirements.txt").write_text("numpy\n")
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    for tool in TOOLS:
        os.symlink(shutil.which(tool), bin_ / tool)
    stubs = {"python3": PYTHON_STUB, "python": PYTHON_STUB, "id": f"#!/usr/bin/env bash\necho {0 if root else 1000}\n"}
    if apt:
        stubs["apt-get"] = APT_STUB
    if sudo:
        stubs["sudo"] = SUDO_STUB
    for name, text in stubs.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    env = {"PATH": str(bin_), "HOME": str(tmp_path), "STUB_LOG": str(log), "TMPDIR": str(tmp_path),
           **{k: str(v) for k, v in env_flags.items()}}
    proc = subprocess.run([str(bin_ / "bash"), str(repo / ".ci" / "setup")], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr, log.read_text().splitlines()


def _pip_installs(calls):
    return [c for c in calls if c.startswith("python -m pip install") and "--upgrade pip" not in c]


def test_torch_comes_from_the_cpu_index_first(tmp_path):
    code, out, calls = run_setup(tmp_path)
    assert code == 0, out
    installs = _pip_installs(calls)
    assert f"--index-url {CPU_INDEX} torch==2.13.0" in installs[0], installs
    assert "-r requirements.txt" in installs[1] and "-e ." in installs[2] and len(installs) == 3, installs
    assert "the CPU build" in out


@pytest.mark.parametrize("why", ["unreachable", "pip_fails"])
def test_torch_falls_back_to_the_default_index(tmp_path, why):
    flags = {"STUB_INDEX_UP": 0} if why == "unreachable" else {"STUB_CPU_PIP_FAILS": 1}
    code, out, calls = run_setup(tmp_path, **flags)
    assert code == 0, out
    installs = _pip_installs(calls)
    torch_installs = [c for c in installs if "torch==2.13.0" in c]
    assert torch_installs[-1].endswith("install -q torch==2.13.0"), installs  # the default index, last
    assert ("--index-url" in torch_installs[0]) == (why == "pip_fails")  # unreachable: not even tried
    assert "could not be used" in out and "CUDA build" in out
    assert installs.index(torch_installs[-1]) < [i for i, c in enumerate(installs) if "-r requirements.txt" in c][0]


def test_chromium_is_installed_with_a_word_on_why(tmp_path):
    code, out, calls = run_setup(tmp_path)
    assert code == 0, out
    assert "apt-get install -y -qq chromium" in calls
    assert "installing Debian's chromium" in out and "headless Chromium" in out
    code, out, calls = run_setup(tmp_path / "user", root=False)
    assert code == 0 and "sudo -n apt-get install -y -qq chromium" in calls, out  # no terminal: never prompts


@pytest.mark.parametrize("case", ["no_apt", "no_sudo", "apt_fails"])
def test_setup_goes_on_with_a_clear_message_where_chromium_cannot_be_installed(tmp_path, case):
    kwargs = {"no_apt": dict(apt=False), "no_sudo": dict(root=False, sudo=False),
              "apt_fails": dict(STUB_APT_FAILS=1)}[case]
    code, out, calls = run_setup(tmp_path, **kwargs)
    assert code == 0, out
    assert "Chromium NOT installed" in out and "tests/test_book.py" in out and "will fail" in out
    why = {"no_apt": "no apt-get", "no_sudo": "no sudo", "apt_fails": "apt-get failed"}[case]
    assert why in out
    if case == "apt_fails":
        assert "Unable to locate package chromium" in out  # apt-get's own words
    assert len(_pip_installs(calls)) == 3  # everything else installed


def test_chromium_tests_fail_never_skip_without_chromium(monkeypatch):
    """What setup promises: without Chromium the page tests fail with the install command."""
    import helpers

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(Path, "is_file", lambda self: False)
    with pytest.raises(AssertionError, match="apt-get install -y chromium"):
        helpers.chromium_path()
