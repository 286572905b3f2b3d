"""`kvlab start`: the labs land in the learner's folder, an edited lab is never overwritten (the
course's copy goes beside it), a folder it cannot use exits 2, JupyterLab starts as `make lab`."""

import os
import sys

import pytest
from conftest import ROOT

import kvlab
from kvlab.cli import main as cli
from kvlab.course import start
from kvlab.course.start import StartError, lab_command, place_labs, side_names

LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def test_labs_are_copied_then_left_alone(tmp_path):
    placed = place_labs(tmp_path / "course", LABS, "0.1.0")
    assert [(p.name, p.action) for p in placed] == [(lab.name, "copied") for lab in LABS]
    for lab in LABS:
        assert (tmp_path / "course" / lab.name).read_bytes() == lab.read_bytes()
    again = place_labs(tmp_path / "course", LABS, "0.1.0")
    assert {p.action for p in again} == {"unchanged"}
    assert sorted(os.listdir(tmp_path / "course")) == [lab.name for lab in LABS]


def test_an_edited_lab_is_kept_and_the_course_copy_goes_beside_it(tmp_path):
    lab = LABS[3]
    mine = tmp_path / lab.name
    mine.write_text("my answers")
    (p,) = place_labs(tmp_path, [lab], "0.2.0")
    side = f"{lab.stem}.kvlab-0.2.0.ipynb"
    assert (p.action, p.beside, p.new) == ("kept", side, True)
    assert "now beside it" in p.line() and side in p.line()
    assert mine.read_text() == "my answers"
    assert (tmp_path / side).read_bytes() == lab.read_bytes()
    (p,) = place_labs(tmp_path, [lab], "0.2.0")  # nothing new to place
    assert (p.action, p.beside, p.new) == ("kept", side, False)
    (tmp_path / side).write_text("edited too")  # the learner works in that copy as well
    (p,) = place_labs(tmp_path, [lab], "0.2.0")
    assert p.beside == f"{lab.stem}.kvlab-0.2.0-2.ipynb"
    assert (tmp_path / side).read_text() == "edited too"


def test_side_names_count_up():
    names = side_names("03_paged.ipynb", "1.0")
    assert [next(names) for _ in range(3)] == [
        "03_paged.kvlab-1.0.ipynb",
        "03_paged.kvlab-1.0-2.ipynb",
        "03_paged.kvlab-1.0-3.ipynb",
    ]


def test_a_file_is_not_a_folder(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("x")
    with pytest.raises(StartError, match="is a file, not a folder"):
        place_labs(path, LABS, "0.1.0")
    with pytest.raises(StartError, match="cannot create the folder DIR"):
        place_labs(path / "labs", LABS, "0.1.0")


def test_a_read_only_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as for a non-root learner
    with pytest.raises(StartError, match="is not writable: choose a folder of yours"):
        place_labs(tmp_path, LABS, "0.1.0")


def test_a_write_that_fails_is_an_error_naming_the_folder(tmp_path):
    (tmp_path / LABS[0].name).mkdir()  # a folder where the lab should go
    with pytest.raises(StartError, match=f"cannot write into DIR {tmp_path}"):
        place_labs(tmp_path, LABS, "0.1.0")


def test_the_command_exits_2_on_a_bad_dir(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("x")
    assert cli(["start", str(path), "--no-lab"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab start: error: DIR ") and "is a file" in err


def test_the_command_copies_says_what_it_did_and_stops_with_no_lab(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(start, "ensure_kernel", lambda: "kernel: (checked)")
    # --no-lab writes JupyterLab's defaults too (no news toast), for a `jupyter lab` of one's own
    written = []
    monkeypatch.setattr(start, "write_overrides", lambda prefix: written.append(prefix))
    monkeypatch.chdir(tmp_path)
    assert cli(["start", "--no-lab"]) == 0
    assert written == [sys.prefix]
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0]
        == f"kvlab {kvlab.__version__}: the course's {len(LABS)} labs in {tmp_path / 'kvlab-labs'}"
    )
    assert out[1:-2] == [f"  copied    {lab.name}" for lab in LABS]
    assert out[-2] == "kernel: (checked)" and out[-1].startswith("to open them: kvlab start ")


def test_jupyterlab_starts_as_make_lab_does(tmp_path):
    headless = lab_command(tmp_path, "00_why kv.ipynb", environ={}, system="Linux", uid=1000)
    assert headless[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={tmp_path}" in headless
    assert "--LabApp.default_url=/lab/tree/00_why%20kv.ipynb" in headless
    assert "--no-browser" in headless and "--allow-root" not in headless
    desktop = lab_command(tmp_path, "a.ipynb", environ={"DISPLAY": ":0"}, system="Linux", uid=0)
    assert "--no-browser" not in desktop and "--allow-root" in desktop
    mac = lab_command(tmp_path, "a.ipynb", port=9999, environ={}, system="Darwin", uid=501)
    assert "--no-browser" not in mac and "--port=9999" in mac


class _Spec:
    def __init__(self, argv, resource_dir):
        self.argv, self.resource_dir = argv, resource_dir


def test_the_kernel_is_registered_for_the_user_when_the_environment_is_read_only(monkeypatch):
    from jupyter_client import kernelspec

    import kvlab.course.jupyter_kernel as jk

    registered = []

    class Specs:
        def get_kernel_spec(self, name):
            if not registered:
                raise kernelspec.NoSuchKernel(name)
            return _Spec([sys.executable, "-m", "kvlab.course.jupyter_kernel"], registered[-1])

    def install(user=False, prefix=None):
        if prefix is not None:
            raise PermissionError("read-only")
        registered.append("/home/me/.local/share/jupyter/kernels/kvlab")
        return registered[-1]

    monkeypatch.setattr(kernelspec, "KernelSpecManager", Specs)
    monkeypatch.setattr(jk, "install", install)
    said = start.ensure_kernel()
    assert (
        said
        == "kernel: registered 'kvlab (Python 3)' in /home/me/.local/share/jupyter/kernels/kvlab"
    )
    assert start.ensure_kernel().startswith("kernel: 'kvlab (Python 3)' is registered")
