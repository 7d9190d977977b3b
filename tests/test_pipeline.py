"""The streaming data pipeline (omnicore.data.pipeline and its stages): mixing, sharding, workers, windows, resume.

Text-only samples through the real ChatProcessor and byte tokenizer; the sources are JSONL files read
by omnicore.data.sources, so everything below is what `omnicore train` reads.
"""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path

import pytest

from omnicore.config import DataConfig, SourceConfig
from omnicore.data.chat import ChatProcessor
from omnicore.data.jsonl import SampleError
from omnicore.data.loader import DataWorkerError
from omnicore.data.pipeline import DataPipeline
from omnicore.data.reading import DataExhausted, ShardReader, shuffle_buffer
from omnicore.data.sources import open_source
from omnicore.data.state import DataResumeError, merge_states


@pytest.fixture(scope="module")
def chat():
    from omnicore.model.build import prepare_tokenizer
    from omnicore.model.foundation import byte_tokenizer

    return ChatProcessor(prepare_tokenizer(byte_tokenizer(), [], []), {}, {}, max_tokens=64)


def _write(path: Path, n: int, tag: str, bad: set[int] = frozenset()) -> Path:
    """``n`` chat lines; the answer of line ``i`` is ``f"{tag}{i}"``; lines in ``bad`` are not JSON."""
    rng = random.Random(tag)
    with path.open("w") as fh:
        for i in range(n):
            if i in bad:
                fh.write("{not json\n")
                continue
            q = "q" * rng.randrange(1, 20)
            fh.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": f"{tag}{i}"}]}) + "\n")
    return path


def _answers(mb, chat) -> list[str]:
    """The answer text of each sample of a collated micro-batch (from its token ids)."""
    ids = mb.input_ids[0].tolist()
    cu = mb.cu_seqlens.tolist()
    out = []
    for a, b in zip(cu, cu[1:]):
        text = chat.tokenizer.decode(ids[a:b])
        out.append(text.split("assistant\n")[1].split("<|im_end|>")[0])
    return out


def _pipeline(tmp_path, chat, sources, *, workers=0, rank=0, groups=1, accum=1, **data_kw):
    data = DataConfig(sources=sources, num_workers=workers, max_tokens=64, packing_window=32, shuffle_buffer=50, **data_kw)
    opened = [open_source(s, tmp_path) for s in data.source_list()]
    return DataPipeline(opened, chat, data, 7, data_rank=rank, data_size=groups, grad_accum=accum)


def _run(pipe, steps, chat) -> list[list[list[str]]]:
    return [[_answers(mb, chat) for mb in pipe.step()] for _ in range(steps)]


# ---- pieces ---------------------------------------------------------------------------------


def test_shuffle_buffer_is_a_seeded_permutation():
    xs = list(range(1000))
    a = list(shuffle_buffer(iter(xs), 64, random.Random(1)))
    assert sorted(a) == xs and a != xs
    assert a == list(shuffle_buffer(iter(xs), 64, random.Random(1)))
    assert a != list(shuffle_buffer(iter(xs), 64, random.Random(2)))
    assert list(shuffle_buffer(iter(xs), 1, random.Random(1))) == xs


@pytest.mark.slow
def test_mixing_proportions_and_order(tmp_path, chat):
    """Three sources with weights 0.5 / 0.3 / 0.2: over 10k positions the shares are within 0.02 of
    the weights, and the same seed gives the same order twice (another seed another order)."""
    srcs = [
        open_source(SourceConfig(path=str(_write(tmp_path / f"{t}.jsonl", 300, t)), weight=w), tmp_path)
        for t, w in zip("abc", (0.5, 0.3, 0.2))
    ]

    def order(seed):
        return [(s, rec.where) for _, s, rec, _ in _take(ShardReader(srcs, 0, 1, seed, buffer=100), 10_000)]

    first = order(3)
    shares = collections.Counter(s for s, _ in first)
    for i, w in enumerate((0.5, 0.3, 0.2)):
        assert abs(shares[i] / 10_000 - w) < 0.02
    assert first == order(3)
    assert first != order(4)
    # restart: source "c" (300 rows, 20%) went round ~6 times; each epoch is a permutation of its rows
    c_lines = [w for s, w in first if s == 2]
    assert sorted(c_lines[:300]) == sorted(c_lines[300:600]) and c_lines[:300] != c_lines[300:600]


def _take(reader, n):
    out = []
    for item in reader:
        out.append(item)
        if len(out) == n:
            break
    return out


def test_shards_partition_each_epoch(tmp_path, chat):
    """Shards of one source together hold every row once per epoch, whatever their number."""
    f = _write(tmp_path / "a.jsonl", 97, "a")
    src = open_source(SourceConfig(path=str(f), on_exhausted="stop"), tmp_path)
    for n in (1, 2, 3, 5):
        wheres = [rec.where for v in range(n) for _, _, rec, _ in ShardReader([src], v, n, 0, buffer=10)]
        assert sorted(wheres) == sorted(f"{f}:{i}" for i in range(1, 98))


# ---- the pipeline ---------------------------------------------------------------------------


def test_two_groups_equal_one_group_with_accumulation(tmp_path, chat):
    """Data groups x grad_accum = 2 either way: rank r of two reads what micro-batch r of one reads."""
    src = [SourceConfig(path=str(_write(tmp_path / "a.jsonl", 200, "a")))]
    one = _run(_pipeline(tmp_path, chat, src, accum=2), 6, chat)
    r0 = _run(_pipeline(tmp_path, chat, src, rank=0, groups=2), 6, chat)
    r1 = _run(_pipeline(tmp_path, chat, src, rank=1, groups=2), 6, chat)
    assert [s[0] for s in one] == [s[0] for s in r0]
    assert [s[1] for s in one] == [s[0] for s in r1]
    seen = [a for s in one for mb in s for a in mb]
    assert len(seen) == len(set(seen))  # no sample twice within the first epoch's share


@pytest.mark.slow
def test_workers_give_the_same_stream(tmp_path, chat):
    src = [SourceConfig(path=str(_write(tmp_path / "a.jsonl", 150, "a"))), SourceConfig(path=str(_write(tmp_path / "b.jsonl", 90, "b")))]
    base = _run(_pipeline(tmp_path, chat, src, accum=2), 8, chat)
    assert _run(_pipeline(tmp_path, chat, src, accum=2, workers=2), 8, chat) == base
    assert _run(_pipeline(tmp_path, chat, src, accum=2, workers=3), 8, chat) == base


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_continues_exactly(tmp_path, chat, workers):
    """State after k steps, loaded into a fresh pipeline, gives the steps a straight run gives next,
    including the per-source counts; across epochs and mid-window."""
    src = [
        SourceConfig(path=str(_write(tmp_path / "a.jsonl", 70, "a")), weight=2),
        SourceConfig(path=str(_write(tmp_path / "b.jsonl", 40, "b"))),
    ]
    straight = _pipeline(tmp_path, chat, src, accum=2, workers=workers)
    want = _run(straight, 14, chat)
    first = _pipeline(tmp_path, chat, src, accum=2, workers=workers)
    got = _run(first, 5, chat)
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint keeps (JSON)
    second = _pipeline(tmp_path, chat, src, accum=2, workers=workers)
    second.load_state_dict(state)
    got += _run(second, 9, chat)
    assert got == want
    assert second.counts() == straight.counts()


def test_resume_on_another_layout(tmp_path, chat):
    """Two groups x accum 1 -> one group x accum 2 continues exactly; accum 1 -> accum 2 on one group
    (another number of shards) is refused with the reason and a layout that works."""
    src = [SourceConfig(path=str(_write(tmp_path / "a.jsonl", 120, "a")))]
    straight = _run(_pipeline(tmp_path, chat, src, accum=2), 10, chat)
    r = [_pipeline(tmp_path, chat, src, rank=g, groups=2) for g in range(2)]
    for _ in range(4):
        for p in r:
            p.step()
    merged = merge_states([json.loads(json.dumps(p.state_dict())) for p in r])
    one = _pipeline(tmp_path, chat, src, accum=2)
    one.load_state_dict(merged)
    assert _run(one, 6, chat) == straight[4:]
    single = _pipeline(tmp_path, chat, src)
    single.step()
    other = _pipeline(tmp_path, chat, src, accum=2)
    with pytest.raises(DataResumeError, match=r"split into 1 virtual shards.*this run into 2.*grad_accum = 1"):
        other.load_state_dict(single.state_dict())


@pytest.mark.parametrize("workers", [0, 2])
def test_bad_sample_names_file_and_line(tmp_path, chat, workers):
    f = _write(tmp_path / "a.jsonl", 60, "a", bad={41})
    src = [SourceConfig(path=str(f))]
    pipe = _pipeline(tmp_path, chat, src, workers=workers, shuffle=False)
    with pytest.raises(SampleError, match=rf"^{f}:42: not valid JSON"):
        _run(pipe, 40, chat)
    stop = [SourceConfig(path=str(f), on_exhausted="stop")]
    skip = _pipeline(tmp_path, chat, stop, workers=workers, shuffle=False, on_error="skip")
    with pytest.raises(DataExhausted):
        _run(skip, 100, chat)
    assert skip.counts() == ([59], [1])


def test_stop_policy_ends_the_stream(tmp_path, chat):
    """on_exhausted: stop: every row once, then DataExhausted; restart goes on into epoch 2."""
    src = [SourceConfig(path=str(_write(tmp_path / "a.jsonl", 50, "a")), on_exhausted="stop")]
    pipe = _pipeline(tmp_path, chat, src)
    seen = []
    with pytest.raises(DataExhausted):
        for _ in range(100):
            seen += [a for mb in pipe.step() for a in _answers(mb, chat)]
    assert sorted(seen) == sorted(f"a{i}" for i in range(50))
    assert pipe.counts()[0] == [50]


def test_million_line_source_starts_without_reading_the_file(tmp_path, chat):
    """The first step of a 1M-line JSONL source reads only the rows it needs: the shuffle buffer and
    one packing window, not the file (counted at the source, and by the file position)."""
    f = tmp_path / "big.jsonl"
    line = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}) + "\n"
    f.write_text(line * 1_000_000)
    pipe = _pipeline(tmp_path, chat, [SourceConfig(path=str(f))])
    src = pipe.sources[0]
    pulled = []
    real = src.records

    def counting(*args, **kwargs):
        for rec in real(*args, **kwargs):
            pulled.append(rec.where)
            yield rec

    src.records = counting
    mb = pipe.step()[0]
    assert mb.n_targets > 0
    # shuffle buffer (50) + one window (32) + at most one chunk ahead
    assert 50 + 32 <= len(pulled) <= 50 + 32 + 16
    assert pulled[-1] == f"{f}:{len(pulled)}"


@pytest.mark.slow
def test_workers_run_at_the_configured_niceness(tmp_path, chat):
    """data.worker_nice is added to each worker's niceness (read back from the system), and 0 leaves
    them at the training process's."""
    import os

    src = [SourceConfig(path=str(_write(tmp_path / "a.jsonl", 200, "a")))]
    base = os.getpriority(os.PRIO_PROCESS, 0)
    for nice in (7, 0):
        pipe = _pipeline(tmp_path, chat, src, workers=2, worker_nice=nice)
        pipe.step()
        got = [os.getpriority(os.PRIO_PROCESS, w.pid) for w in pipe._it._workers]
        pipe.close()
        assert got == [min(base + nice, 19)] * 2


@pytest.mark.slow
def test_a_dropped_pipeline_ends_its_workers_at_once(tmp_path, chat, monkeypatch):
    """A pipeline garbage-collected without close() terminates its workers itself (close(now=True)),
    rather than leaving them to the DataLoader iterator's shutdown, which waits 5 s for each worker
    blocked on a full result queue; afterwards no worker is alive."""
    import gc

    gc.collect()  # earlier tests' dropped pipelines are closed now, not counted below
    calls = []
    close = DataPipeline.close
    monkeypatch.setattr(DataPipeline, "close", lambda self, now=False: (calls.append((id(self) == key, now)), close(self, now=now))[1])
    src = [SourceConfig(path=str(_write(tmp_path / "a.jsonl", 400, "a")))]
    pipe = _pipeline(tmp_path, chat, src, workers=2)
    pipe.step()
    key = id(pipe)  # an id, not a reference: the pipeline must be garbage
    workers = list(pipe._it._workers)
    assert all(w.is_alive() for w in workers)
    del pipe
    gc.collect()
    assert [now for ours, now in calls if ours] == [True]
    assert not any(w.is_alive() for w in workers)


@pytest.mark.slow
def test_a_dead_worker_ends_the_run_with_a_message(tmp_path, chat):
    """A worker killed (out of memory, say) stops the next steps with DataWorkerError naming the
    setting to change; never a hang."""
    import os
    import signal

    src = [SourceConfig(path=str(_write(tmp_path / "a.jsonl", 4000, "a")))]
    pipe = _pipeline(tmp_path, chat, src, workers=2)
    pipe.step()
    os.kill(pipe._it._workers[1].pid, signal.SIGKILL)
    with pytest.raises(DataWorkerError, match=r"a data worker died: .*(exited unexpectedly|killed by signal).*data.num_workers 2"):
        for _ in range(2000):
            pipe.step()
    pipe.close()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_uneven_shards_keep_bounded_queues(tmp_path, chat, workers):
    """grad_accum 2 over a file whose even rows are long and odd rows short: shard 0 uses 2x the
    samples per row of shard 1, yet what waits decoded in the training process stays bounded (the
    sampler asks for the hungriest shard), and the stream is the one 0 workers give."""
    f = tmp_path / "uneven.jsonl"
    with f.open("w") as fh:
        for i in range(3000):
            q = "q" * (34 if i % 2 else 2)
            fh.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": f"a{i}"}]}) + "\n")
    pipe = _pipeline(tmp_path, chat, [SourceConfig(path=str(f))], accum=2, workers=workers, shuffle=False)
    peak, answers = 0, []
    for _ in range(150):
        answers.append([_answers(mb, chat) for mb in pipe.step()])
        peak = max(peak, sum(len(q) for q in pipe._queues))
    pipe.close()
    per_row = [sum(len(s[k]) for s in answers) for k in range(2)]
    assert per_row[0] >= 2 * per_row[1]  # the shards really are uneven
    # in flight at most two windows per shard (prefetch), plus the window being filled
    assert peak <= 2 * (2 * 32 + 32)
    if workers:
        assert answers == _run(_pipeline(tmp_path, chat, [SourceConfig(path=str(f))], accum=2, shuffle=False), 150, chat)


def test_resume_with_changed_settings_is_refused(tmp_path, chat):
    src = [SourceConfig(path=str(_write(tmp_path / "a.jsonl", 100, "a")))]
    first = _pipeline(tmp_path, chat, src)
    first.step()
    other = _pipeline(tmp_path, chat, src, packing="ffd")
    with pytest.raises(DataResumeError, match=r"data.packing was 'first_fit', now 'ffd'"):
        other.load_state_dict(first.state_dict())


def test_all_bad_samples_under_skip_stop_instead_of_looping(tmp_path, chat):
    f = _write(tmp_path / "bad.jsonl", 300, "a", bad=set(range(300)))
    pipe = _pipeline(tmp_path, chat, [SourceConfig(path=str(f))], on_error="skip")
    with pytest.raises(SampleError, match=rf"none of the last 128 samples could be used.*the last: {f}:\d+: not valid JSON"):
        pipe.step()
