"""Where the course's files are: a checkout's folders, else the bundle a wheel carries; a clear
error naming what is missing otherwise."""

import pytest
from conftest import ROOT

from kvlab.core import files


def _checkout(tmp_path):
    root = tmp_path / "repo"
    for folder in ("kvlab", "solutions", "labs", "assets/traces"):
        (root / folder).mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'kvlab'\n")
    (root / "labs" / "00_first.ipynb").write_text("{}")
    return root


def _installed(tmp_path, bundled=True):
    package = tmp_path / "site-packages" / "kvlab"
    package.mkdir(parents=True)
    if bundled:
        (package / "_bundled" / "labs").mkdir(parents=True)
        (package / "_bundled" / "labs" / "00_first.ipynb").write_text("{}")
    return package


def test_a_checkout_reads_its_own_top_level_folders(tmp_path):
    root = _checkout(tmp_path)
    package = root / "kvlab"
    assert files.course_root(package) == ("checkout", root)
    assert files.labs_dir(package) == root / "labs"
    assert files.traces_dir(package) == root / "assets" / "traces"
    assert files.lab_notebooks(package) == [root / "labs" / "00_first.ipynb"]
    assert (
        files.checkout_path("benchmarks", purpose="x", package_dir=package) == root / "benchmarks"
    )


def test_a_checkout_missing_a_folder_says_how_to_restore_it(tmp_path):
    package = _checkout(tmp_path) / "kvlab"
    with pytest.raises(
        FileNotFoundError, match=r"assets/tiny_model is missing.*git -C .* checkout"
    ):
        files.tiny_model_dir(package)


def test_a_wheel_reads_its_bundle(tmp_path):
    package = _installed(tmp_path)
    assert files.course_root(package) == ("bundle", package / "_bundled")
    assert files.checkout_root(package) is None
    assert files.labs_dir(package) == package / "_bundled" / "labs"
    with pytest.raises(FileNotFoundError, match=r"assets/traces is missing.*reinstall"):
        files.traces_dir(package)


def test_without_either_the_error_names_both_places_and_the_fix(tmp_path):
    package = _installed(tmp_path, bundled=False)
    assert files.course_root(package) is None
    with pytest.raises(FileNotFoundError) as e:
        files.labs_dir(package)
    message = str(e.value)
    assert "labs is missing" in message and str(package / "_bundled") in message
    assert "make wheel" in message


def test_an_empty_labs_folder_is_an_error(tmp_path):
    package = _installed(tmp_path)
    (package / "_bundled" / "labs" / "00_first.ipynb").unlink()
    with pytest.raises(FileNotFoundError, match="holds no NN_name.ipynb"):
        files.lab_notebooks(package)


def test_writers_of_the_checkout_refuse_a_wheel_and_say_why(tmp_path):
    package = _installed(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^kvlab bench serve writes into a git checkout"):
        files.checkout_path("benchmarks", purpose="kvlab bench serve", package_dir=package)


def test_course_path_needs_a_path():
    with pytest.raises(ValueError, match="course_path needs a relative path"):
        files.course_path()


def test_here_the_course_is_this_checkout():
    assert files.course_root() == ("checkout", ROOT)
    assert [p.name for p in files.lab_notebooks()] == sorted(
        p.name for p in (ROOT / "labs").glob("*.ipynb")
    )


def test_the_graders_sandbox_sees_a_checkouts_assets_only(tmp_path):
    """The judge shows a submission the checkout's assets and its package, not pyproject.toml or
    solutions/: the traces and the tiny model are still found there (a checkout under /tmp)."""
    root = tmp_path / "repo"
    package = root / "kvlab"
    package.mkdir(parents=True)
    (root / "assets" / "traces").mkdir(parents=True)
    (root / "assets" / "tiny_model").mkdir(parents=True)
    with pytest.raises(FileNotFoundError):
        files.traces_dir(package)  # a folder named assets is not enough
    (root / "assets" / "traces" / "sharegpt_like.csv").write_text("prompt_len,output_len\n")
    (root / "assets" / "tiny_model" / "config.json").write_text("{}")
    assert files.course_root(package) is None
    assert files.traces_dir(package) == root / "assets" / "traces"
    assert files.tiny_model_dir(package) == root / "assets" / "tiny_model"
    with pytest.raises(FileNotFoundError):
        files.labs_dir(package)  # only assets are read from beside the package
