"""Labs 03–05 checks: the reference passes; plausible mistakes fail the check that targets them."""

from kvlab.grading import run_checks


def failed(result) -> list[str]:
    return [o.name for o in result.outcomes if not o.passed]


def mine(reference):
    """kvlab's reference behind a learner's own function (kvlab's objects are refused as such)."""
    return lambda *args: reference(*args)


def learner_class(base):
    """A subclass that looks like learner code (kvlab's own classes are refused)."""
    return type(base.__name__, (base,), {"__module__": "__main__"})


def test_block_manager_checks():
    from kvlab.paged import BlockManager

    Mine = learner_class(BlockManager)
    assert run_checks("03.block_manager", Mine).ok

    class OffByOne(Mine):
        def blocks_needed(self, num_tokens):
            return num_tokens // self.block_size + 1  # one room too many at exact multiples

    assert failed(run_checks("03.block_manager", OffByOne))[0].startswith("allocate: n tokens get")

    class Leaky(Mine):
        def allocate(self, seq_id, num_tokens):
            if self.blocks_needed(num_tokens) > self.num_free_blocks and self._free:
                self._free.pop()  # takes a room before noticing it cannot finish
            return super().allocate(seq_id, num_tokens)

    assert "out of rooms: OutOfBlocks (a MemoryError), and nothing changes" in failed(
        run_checks("03.block_manager", Leaky)
    )

    class Unfinished(Mine):
        def append_slot(self, seq_id):
            raise NotImplementedError

    result = run_checks("03.block_manager", Unfinished)
    assert (
        result.status == "failed" and result.outcomes[0].passed
    )  # allocate works; the rest says why
    assert "not implemented yet" in result.outcomes[1].details


def test_beds_report_checks():
    def good(m, ids):
        used = sum(m.num_tokens(s) for s in ids)
        held = sum(len(m.block_table(s)) for s in ids) * m.block_size
        return {"used": used, "empty": held - used, "free": m.num_free_blocks * m.block_size}

    assert run_checks("03.beds_report", good).ok

    def rooms_not_beds(m, ids):
        report = good(m, ids)
        report["free"] = m.num_free_blocks
        return report

    assert (
        failed(run_checks("03.beds_report", rooms_not_beds))[0]
        == "two guests with partly filled last rooms"
    )


def test_paged_attention_checks():
    import torch

    from kvlab.attention import decode_attention, paged_decode_attention_ref

    assert run_checks("04.paged_attention", mine(paged_decode_attention_ref)).ok

    def whole_rows(q, kc, vc, bt, sl):  # reads padding entries too
        out = torch.empty_like(q)
        for s in range(q.shape[0]):
            k = kc[bt[s].long()].reshape(-1, *kc.shape[2:])[: int(sl[s])]
            v = vc[bt[s].long()].reshape(-1, *vc.shape[2:])[: int(sl[s])]
            out[s] = decode_attention(q[s], k, v)
        return out

    assert "unused key-card entries hold garbage (-1, 10**9) and must never be read" in failed(
        run_checks("04.paged_attention", whole_rows)
    )

    def no_cut(q, kc, vc, bt, sl):  # forgets to drop the empty beds of the last room
        out = torch.empty_like(q)
        for s in range(q.shape[0]):
            rooms = bt[s, : -(-int(sl[s]) // kc.shape[1])].long()
            out[s] = decode_attention(q[s], kc[rooms].flatten(0, 1), vc[rooms].flatten(0, 1))
        return out

    assert failed(run_checks("04.paged_attention", no_cut))[0] == "one guest in one room"


def test_kernel_checks():
    from kvlab.kernels import paged_decode_kernel

    refused = run_checks("05.kernel", paged_decode_kernel)
    assert refused.status == "wrong kind" and "kvlab's reference" in refused.outcomes[0].details[0]

    unwritten = _lab05_kernel(stub="raise NotImplementedError")  # the lab as learners get it
    assert run_checks("05.kernel", unwritten).status == "not implemented"

    zeros = _lab05_kernel(
        stub="seq = tl.program_id(0)\n"
        "    d = tl.arange(0, D_P2)\n"
        "    tl.store(out_ptr + seq * stride_os + d * stride_od, tl.zeros([D_P2], tl.float32), "
        "mask=d < HEAD_DIM)"
    )
    result = run_checks("05.kernel", zeros)
    assert result.passed == 0 and "differs from the reference" in result.outcomes[0].details[0]


def _lab05_kernel(edit: str | None = None, stub: str | None = None):
    """A learner-style Lab 05 kernel from the solution notebook: the solution with one edit
    ("old => new"), or labgen's learner stub with ``stub`` in place of its NotImplementedError."""
    import json
    import pathlib
    import tempfile

    from kvlab.labgen import strip_solution

    notebook = pathlib.Path(__file__).parents[1] / "solutions" / "05_triton_kernel.ipynb"
    cells = json.loads(notebook.read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if c.get("id") == "lab05-07")
    if stub is not None:
        source = strip_solution(source)[0].replace("raise NotImplementedError", stub)
    else:
        source = "".join(line for line in source.splitlines(True) if "### " not in line)
        old, new = edit.split(" => ")
        assert old in source, old
        source = source.replace(old, new)
    header = "import triton\nimport triton.language as tl\n\n"
    folder = pathlib.Path(tempfile.mkdtemp(prefix="kvlab-learner-"))
    path = folder / "learner.py"  # @triton.jit reads the source from a file
    path.write_text(header + source)
    namespace = {}
    exec(compile(header + source, str(path), "exec"), namespace)
    return namespace["my_paged_decode_kernel"]


def test_kernel_that_corrupts_memory_fails_one_check_per_crash():
    """A store outside every tensor kills the interpreter's process: the checks run in children,
    so the report still comes back, one line per check."""
    crashing = _lab05_kernel("out_ptr + seq => out_ptr + 2**40 + seq")  # far outside
    result = run_checks("05.kernel", crashing)
    assert result.status == "failed" and result.passed == 0
    first, *rest = result.outcomes
    assert first.details[0].startswith("your code crashed the process (SIG"), first.details
    assert "mask every tl.load / tl.store" in first.details[1]
    assert all(o.details == ["the same problem as above"] for o in rest)


def test_kernel_mistakes_get_a_diagnosis():
    no_scale = _lab05_kernel("axis=2) * scale => axis=2)")
    details = run_checks("05.kernel", no_scale).outcomes[0].details
    assert any("multiply the scores q·k by scale" in d for d in details), details


def test_paged_attention_diagnoses_the_wrong_kv_head():
    import torch

    from kvlab.attention import decode_attention, gather_kv

    def modulo_heads(q, kc, vc, bt, sl):
        out = torch.empty_like(q)
        heads = [h % kc.shape[2] for h in range(q.shape[1])]
        for s in range(q.shape[0]):
            k, v = gather_kv(kc, vc, bt[s], int(sl[s]))
            out[s] = decode_attention(q[s], k[:, heads], v[:, heads])
        return out

    result = run_checks("04.paged_attention", modulo_heads)
    gqa = next(o for o in result.outcomes if o.name.startswith("grouped-query"))
    assert any("h // 4 (the group size)" in d for d in gqa.details), gqa.details
    assert any(d.startswith("expected: [") and "values)" in d for d in gqa.details)
