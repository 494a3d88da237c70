"""The built-in agent's Python in a machine starts without ``site`` (``-S``): no ``.pth`` file's code runs in it, and
its packages are found on the ``PYTHONPATH`` it is given (:func:`swarmyard.machines.environment.lean_python`)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.machines import Machines
from swarmyard.machines.environment import MACHINE_PYTHON, lean_python, lean_python_for
from swarmyard.machines.process import ProcessWarning


def _site(tmp_path: Path) -> Path:
    folder = tmp_path / "site-packages"
    (folder / "pkg" / "inner").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "hook.pth").write_text("import os; os.environ['HOOKED'] = '1'\n# a comment\npkg/inner\n../elsewhere\n")
    (tmp_path / "elsewhere").mkdir()
    return folder


def test_site_folders_and_their_pth_folders_are_on_the_path_and_no_code(tmp_path: Path) -> None:
    folder = _site(tmp_path)
    lean = lean_python_for([str(folder)], str(tmp_path / "src"))
    assert lean.argv == (*MACHINE_PYTHON, "-S")
    # the source root first (an editable install's), then the site folder, then the folder its .pth names inside
    # it; not the one outside every site folder (no machine sees it), not the .pth's code line
    assert lean.env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "src"), str(folder),
                                                        str(folder / "pkg" / "inner")]


def test_swarmyard_in_a_site_folder_adds_no_source_root(tmp_path: Path) -> None:
    folder = _site(tmp_path)
    lean = lean_python_for([str(folder)], str(folder))
    assert lean.env["PYTHONPATH"].split(os.pathsep)[0] == str(folder)


@pytest.mark.parametrize("shadow", ["enum.py", "typing", "json.cpython-311-x86_64-linux-gnu.so"])
def test_a_site_folder_shadowing_the_standard_library_keeps_site(tmp_path: Path, shadow: str) -> None:
    # on PYTHONPATH it would come before the standard library, where site puts it after
    folder = _site(tmp_path)
    (folder / shadow).mkdir() if "." not in shadow else (folder / shadow).write_text("")
    lean = lean_python_for([str(folder)], str(tmp_path / "src"))
    assert lean.argv == MACHINE_PYTHON and dict(lean.env) == {}


@pytest.fixture(params=["local", "process"])
def machines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Machines]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProcessWarning)
        api = Machines(request.param, root=tmp_path / "run")
        yield api
        api.close()


@pytest.mark.bwrap
def test_the_agent_starts_in_a_machine_without_site(machines: Machines) -> None:
    lean = lean_python()
    info = machines.create("lean")
    machines.wait_until_ready(info.id)
    probe = ("import sys, swarmyard.agents.entry, httptools\n"
             "print(sys.flags.no_site, 'site' in sys.modules, swarmyard.agents.entry.__name__)")
    done = machines.exec(info.id, [*lean.argv, "-c", probe], env=dict(lean.env), timeout=60)
    assert done.exit_code == 0, done.stderr
    no_site = "-S" in lean.argv
    assert done.stdout.decode().split() == [str(int(no_site)), str(not no_site), "swarmyard.agents.entry"]
    # and as the machine launcher starts it: it runs, and stops on its missing configuration
    agent = machines.exec(info.id, [*lean.argv, "-m", "swarmyard.agents"], env=dict(lean.env), timeout=60)
    assert agent.exit_code == 1 and b"SWARMYARD_PLANE_URL" in agent.stderr, agent.stderr


def test_the_agents_bytecode_is_current_once_its_python_is_asked_for() -> None:
    # a machine reads the package read-only: a module without current bytecode would be compiled by every agent
    import importlib.util

    import swarmyard.agents.builtin as builtin

    lean_python()
    source = Path(builtin.__file__)
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not os.access(cached.parent if cached.parent.exists() else source.parent, os.W_OK):
        pytest.skip("the package folder is not writable here")
    header = cached.read_bytes()[:16]
    assert int.from_bytes(header[8:12], "little") == int(source.stat().st_mtime) & 0xFFFFFFFF  # for this source
