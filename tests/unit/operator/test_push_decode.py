"""A push decoded from its file one rank at a time (evidence.push_decode, issue 34): the same evidence
as the whole-body decoder for real bodies (plain and gzip, pieces larger than the first read), and each
hostile shape refused or confined to its rank, with the file never read whole."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from frscope.operator.evidence import push_decode
from frscope.operator.evidence.pod_evidence import from_bytes
from frscope.operator.evidence.push_decode import decode_file
from frscope.operator.evidence.sidecars import SidecarError
from tests.unit.operator.test_http import body


def write(tmp_path: Path, data: bytes, name: str = "push") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def summary(evidence: Any) -> tuple[Any, ...]:
    return (evidence.namespace, evidence.pod, evidence.reason, evidence.captured_at_ns, evidence.ranks,
            [len(d.entries) for d in evidence.dumps], [d.stacks for d in evidence.dumps],
            [str(p) for p in evidence.problems], evidence.entries_dropped, evidence.size_bytes)


@pytest.mark.parametrize("max_entries", [0, 3])
def test_the_same_evidence_as_the_whole_body_decoder(tmp_path: Path, hang_ranks: dict[int, Any],
                                                     monkeypatch: pytest.MonkeyPatch, max_entries: int) -> None:
    monkeypatch.setattr(push_decode, "FIRST_READ", 512)  # every piece is larger than the first read
    raw = body(hang_ranks)
    whole = from_bytes(raw, "push", origin="push", max_entries=max_entries)
    for data in (raw, gzip.compress(raw)):
        piecewise = decode_file(write(tmp_path, data), "push", origin="push", max_entries=max_entries)
        assert summary(piecewise) == summary(whole)
        assert piecewise.measured_bytes > 0


def test_pieces_of_every_size_after_one_another_and_the_collector_back_on(tmp_path: Path,
                                                                        hang_ranks: dict[int, Any],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each piece is read at once at the size of the one before it (decoded once, not twice): a piece much
    larger or smaller than the one before decodes the same; the cycle collector, paused while a body
    decodes, is on again after it, and after a body that is refused."""
    import gc

    monkeypatch.setattr(push_decode, "FIRST_READ", 512)
    obj = json.loads(body(hang_ranks))
    big = dict(obj["ranks"][1], stacks="x" * 300_000)  # 300 KB between two pieces of a few KB
    obj["ranks"][1:2] = [big, obj["ranks"][1]]
    obj["ranks"][1:1] = [dict(obj["ranks"][0], stacks=None)]
    raw = json.dumps(obj).encode()
    whole = from_bytes(raw, "push", origin="push", max_entries=0)
    assert gc.isenabled()
    assert summary(decode_file(write(tmp_path, raw), "push", origin="push", max_entries=0)) == summary(whole)
    assert gc.isenabled()
    with pytest.raises(SidecarError):
        decode_file(write(tmp_path, raw[: len(raw) // 2]), "push", origin="push")
    assert gc.isenabled()


@pytest.mark.parametrize("number", ["12345678901234567890", "-12345678901234567890", "-1234567890123456789",
                                    "123456789012345678901234567890", "9" * 5000])
def test_long_ints_read_as_the_whole_body_decoder_reads_them(tmp_path: Path, hang_ranks: dict[int, Any],
                                                             number: str) -> None:
    """An int literal past 20 characters (its sign included) is 'not recorded', whether the window it is
    in is read with the per-int hook or (no run of 20 digits in it) with Python's own int parsing."""
    raw = body(hang_ranks)
    seq = b'"collective_seq_id": '
    at = raw.index(seq, raw.index(b'"entries"')) + len(seq)
    end = at + len(raw[at:].split(b",", 1)[0])
    raw = raw[:at] + number.encode() + raw[end:]
    whole = from_bytes(raw, "push", origin="push", max_entries=0)
    assert summary(decode_file(write(tmp_path, raw), "push", origin="push", max_entries=0)) == summary(whole)


def test_the_callers_pod_and_namespace_win_and_a_bad_rank_is_its_own_problem(tmp_path: Path,
                                                                           hang_ranks: dict[int, Any]) -> None:
    obj = json.loads(body(hang_ranks))
    nested = {"rank": 7, "trace": {"entries": []}}
    for _ in range(400):
        nested = {"x": nested}
    obj["ranks"][1:1] = [nested, {"rank": 8, "trace": {"entries": [[]] * 50_000}}, 42]
    obj["errors"] = [{"rank": 9, "message": "rank 9's socket did not answer"}]
    got = decode_file(write(tmp_path, json.dumps(obj).encode()), "push", origin="push", pod="p", namespace="ml")
    assert (got.namespace, got.pod, got.ranks) == ("ml", "p", (0, 1, 2, 3))
    problems = " | ".join(str(p) for p in got.problems)
    assert "nested too deeply" in problems and "tiny JSON objects" in problems and "rank 9's socket" in problems


HEAD = b'{"schema": "frscope.sidecar.snapshot/v1", "pod": "p", "namespace": "ml", "errors": [], "ranks": ['


@pytest.mark.parametrize(("data", "why"), [
    (HEAD + b'{"rank": 0, "trace": "' + b"x" * (push_decode.MAX_PIECE_BYTES + 10) + b'"}]}',
     "rank piece #0 is over"),
    (HEAD + b'{"rank": 0}, {"rank": 1, "trace": [1, 2', "not JSON"),
    (HEAD + b'{"rank": 0}, nonsense]}', "not JSON"),
    (HEAD + b'{"rank": 0}], "pad": "' + b"y" * (push_decode.MAX_REST_BYTES + 10) + b'"}', "other than its ranks"),
    (b'{"schema": "frscope.sidecar.snapshot/v1", "pod": "p"}', "no 'ranks' array"),
    (gzip.compress(HEAD + b"]}")[:-8], "gzip stream ends early"),
    (b"\x1f\x8bnot gzip at all", "corrupt gzip"),
    (HEAD + b'{"rank": 0, "s": "\xff\xfe"}]}', "not UTF-8"),
])
def test_hostile_bodies_are_refused_with_the_reason(tmp_path: Path, data: bytes, why: str) -> None:
    with pytest.raises(SidecarError, match=why):
        decode_file(write(tmp_path, data), "push", origin="push")


def test_a_gzip_bomb_stops_at_its_expansion_and_leaves_no_file(tmp_path: Path) -> None:
    bomb = gzip.compress(HEAD + b"{}," * 2_000_000 + b"{}]}", 9)
    with pytest.raises(SidecarError, match="once decompressed"):
        decode_file(write(tmp_path, bomb), "push", origin="push")
    assert [p.name for p in tmp_path.iterdir()] == ["push"]


def test_a_kept_push_the_operator_compressed_reloads_past_the_expansion_cap(tmp_path: Path,
                                                                            hang_ranks: dict[int, Any]) -> None:
    """A plain push of repetitive stacks compresses past 64x when the operator keeps it: reloading it
    allows what was accepted plain (`plain_bytes`, --max-push-bytes); a gzip push as sent does not."""
    obj = json.loads(body(hang_ranks))
    obj["ranks"][0]["stacks"] = "  File \"train.py\", line 1 in step\n" * 200_000
    raw = json.dumps(obj).encode()
    kept = gzip.compress(raw, 9)
    assert len(raw) > 64 * len(kept) + (1 << 20)
    with pytest.raises(SidecarError, match="once decompressed"):
        decode_file(write(tmp_path, kept), "push", origin="push")
    got = decode_file(write(tmp_path, kept), "push", origin="push", plain_bytes=len(raw))
    assert got.ranks == (0, 1, 2, 3)


@pytest.mark.parametrize("packed", ["plain", "gzip"])
def test_a_body_with_the_same_ranks_is_not_decoded_again(tmp_path: Path, hang_ranks: dict[int, Any],
                                                         packed: str) -> None:
    """The live windows' reuse: the digest covers the ranks and errors (not the envelope's head, which
    says when it was rendered); a body of the digest asked about comes back `unchanged`, undecoded, and
    any other body is decoded."""
    def pack(obj: dict[str, Any]) -> bytes:
        raw = json.dumps(obj).encode()
        return gzip.compress(raw) if packed == "gzip" else raw

    obj = json.loads(body(hang_ranks))
    first = decode_file(write(tmp_path, pack(obj), "a"), "push", origin="sidecar", max_entries=0, with_digest=True)
    assert first.digest and not first.unchanged and first.dumps
    rendered_later = dict(obj, captured_at_ns=obj["captured_at_ns"] + 2_000_000_000, reason="poll")
    same = decode_file(write(tmp_path, pack(rendered_later), "b"), "push", origin="sidecar", max_entries=0,
                       unchanged_if=first.digest)
    assert same.unchanged and same.digest == first.digest and not same.dumps and not same.problems
    moved = json.loads(json.dumps(obj))
    moved["ranks"][0]["trace"]["entries"].pop()  # a full poll later: one rank's recorder differs
    other = decode_file(write(tmp_path, pack(moved), "c"), "push", origin="sidecar", max_entries=0,
                        unchanged_if=first.digest)
    assert not other.unchanged and other.digest != first.digest
    assert [len(d.entries) for d in other.dumps] == [len(d.entries) - (i == 0) for i, d in enumerate(first.dumps)]
    if packed == "gzip":  # in memory and from the inflated file: one digest
        assert push_decode.inflated_digest(Path(tmp_path / "c"), 1 << 30, "push")[0] == other.digest


def test_a_push_is_not_digested(tmp_path: Path, hang_ranks: dict[int, Any]) -> None:
    """Only the live windows compare answers: a push costs no pass over its body for a digest."""
    evidence = decode_file(write(tmp_path, gzip.compress(body(hang_ranks))), "push", origin="push", max_entries=0)
    assert evidence.digest == b"" and evidence.dumps
