import os
import subprocess
import sys

from kvlab.runtime import configure_triton, kernel_mode


def test_interpreter_is_chosen_without_a_gpu():
    env = {}
    assert configure_triton(env, has_cuda=False) == "interpreter"
    assert env == {"TRITON_INTERPRET": "1"}


def test_gpu_means_compiled():
    env = {}
    assert configure_triton(env, has_cuda=True) == "compiled"
    assert "TRITON_INTERPRET" not in env


def test_an_explicit_user_setting_wins():
    env = {"TRITON_INTERPRET": "0"}
    assert configure_triton(env, has_cuda=False) == "compiled"
    assert env == {"TRITON_INTERPRET": "0"}
    assert kernel_mode({"TRITON_INTERPRET": "1"}) == "interpreter"


def test_import_kvlab_sets_the_variable_before_any_kernel_exists():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU visible, even on a GPU machine
    code = "import os, kvlab; print(os.environ.get('TRITON_INTERPRET'), kvlab.KERNEL_MODE)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["1", "interpreter"], out.stderr
