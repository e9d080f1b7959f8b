"""Importers: other tools' traces and logs, read from small files in their documented formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import ConfigError, WorkloadError
from tuner.importers import import_trace
from tuner.workloads import dump_trace, load_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "import"


def test_mooncake_blocks_named_by_more_than_one_request_become_shared_prefix_blocks() -> None:
    first, second, third = import_trace("mooncake", DATA / "mooncake.jsonl", {}, name="mc").requests
    assert [b.block for b in first.prompt.shared_prefix] == ["mc-0", "mc-1"]
    assert first.prompt.shared_prefix == second.prompt.shared_prefix
    assert (first.prompt.new_tokens, second.prompt.new_tokens) == (1100 - 1024, 1300 - 1024)
    assert (third.prompt.shared_prefix, third.prompt.new_tokens) == ([], 300)
    assert [r.offset_s for r in (first, second, third)] == [0.0, 0.25, 1.25]


def test_mooncake_block_size_is_an_option_and_an_unknown_option_is_refused() -> None:
    first, *_ = import_trace("mooncake", DATA / "mooncake.jsonl", {"block_tokens": 256}, name="mc").requests
    assert sum(b.tokens for b in first.prompt.shared_prefix) == 512
    with pytest.raises(ConfigError, match="block_size"):
        import_trace("mooncake", DATA / "mooncake.jsonl", {"block_size": 256}, name="mc")


def test_azure_rows_keep_their_timing_to_the_tenth_of_a_microsecond_format() -> None:
    requests = import_trace("azure", DATA / "azure.csv", {}, name="az").requests
    assert [r.offset_s for r in requests] == pytest.approx([0.0, 4.314579, 4.579410], abs=1e-6)
    assert [(r.prompt.new_tokens, r.output_tokens) for r in requests] == [(374, 44), (396, 109), (879, 3)]


def test_an_azure_file_without_its_columns_names_the_missing_ones_and_lists_those_it_has(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("time,ContextTokens,tokens\n1,2,3\n")
    with pytest.raises(WorkloadError) as caught:
        import_trace("azure", path, {}, name="x")
    assert "missing column(s) TIMESTAMP, GeneratedTokens; the header has time, ContextTokens, tokens" in str(
        caught.value
    )


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(
    ("bad_row", "problem"),
    [
        (
            "2023-11-16 18:15:50.0000000,many,44\n",
            "unreadable timestamp or token count: 2023-11-16 18:15:50.0000000,many,44",
        ),
        ("2023-11-16 18:15:50.0000000,374,0\n", "GeneratedTokens must be a whole number from 1 to 10,000,000, got 0"),
        ("2023-11-16 18:15:50.0000000,-3,44\n", "ContextTokens must be a whole number from 1 to 10,000,000, got -3"),
    ],
)
def test_a_bad_azure_row_after_blank_lines_is_named_at_its_own_line_with_its_value(
    tmp_path: Path, bad_row: str, problem: str
) -> None:
    # pandas skips blank lines and numbers the rows it kept: the bad row (line 7 here) was called line 4.
    path = tmp_path / "trace.csv"
    path.write_text("\n" + AZURE_HEADER + AZURE_ROW + "\n\n" + AZURE_ROW + bad_row + AZURE_ROW)
    with pytest.raises(WorkloadError) as caught:
        import_trace("azure", path, {}, name="x")
    assert str(caught.value).startswith(f"{path}:7: {problem}")


def test_blank_lines_in_an_azure_file_are_skipped_and_the_limit_counts_requests(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(AZURE_HEADER + "\n" + AZURE_ROW + "\n\n" + AZURE_ROW + AZURE_ROW)
    assert len(import_trace("azure", path, {}, name="x").requests) == 3
    assert len(import_trace("azure", path, {"limit": 2}, name="x").requests) == 2


def test_jsonl_given_to_the_azure_importer_is_named_at_its_line_with_the_importer_that_fits(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n" + (DATA / "mooncake.jsonl").read_text())
    with pytest.raises(WorkloadError) as caught:
        import_trace("azure", path, {}, name="x")
    message = str(caught.value)
    assert message.startswith(f"{path}:2: a JSON line, not the CSV header")
    assert f"looks like mooncake input: `tuner workload import mooncake {path} --out TRACE`" in message


def test_a_csv_given_to_a_jsonl_importer_names_the_azure_importer(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"azure.csv:1: not valid JSON.*looks like azure input"):
        import_trace("mooncake", DATA / "azure.csv", {}, name="x")


def test_a_file_no_importer_reads_names_the_importers_not_a_flag_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_text("these are my notes\n")
    with pytest.raises(WorkloadError) as caught:
        import_trace("openai-log", path, {}, name="x")
    message = str(caught.value)
    assert "--kind" not in message
    assert message.endswith(
        "; the importer is the first argument of `tuner workload import` (azure, llama-server-log, mooncake, "
        "openai-log)"
    )


def test_an_empty_file_or_a_directory_is_not_told_to_change_its_importer(tmp_path: Path) -> None:
    # No importer would read them: naming the importers would send the user to the wrong fix.
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(WorkloadError) as caught:
        import_trace("mooncake", empty, {}, name="x")
    assert str(caught.value) == f"{empty}: no requests found for the mooncake importer"
    for kind in ("mooncake", "azure"):
        with pytest.raises(WorkloadError) as caught:
            import_trace(kind, tmp_path, {}, name="x")
        assert str(caught.value) == f"{tmp_path}: cannot read: Is a directory"


def test_a_spreadsheets_byte_order_mark_is_read_past_and_a_byte_that_is_not_utf8_is_named_at_its_line(
    tmp_path: Path,
) -> None:
    csv = tmp_path / "trace.csv"
    csv.write_bytes(("\ufeff" + AZURE_HEADER + AZURE_ROW).encode())
    assert len(import_trace("azure", csv, {}, name="x").requests) == 1
    jsonl = tmp_path / "trace.jsonl"
    good = (DATA / "mooncake.jsonl").read_text().splitlines()[0]
    jsonl.write_bytes(("\ufeff" + good + "\n").encode() + b'{"timestamp": \xff}\n')
    with pytest.raises(WorkloadError) as caught:
        import_trace("mooncake", jsonl, {}, name="x")
    assert str(caught.value).startswith(f"{jsonl}:2: not UTF-8 text;")
    csv.write_bytes((AZURE_HEADER + AZURE_ROW).encode() + b"2023-11-16 18:15:47.0,3\xff4,44\n")
    with pytest.raises(WorkloadError) as caught:
        import_trace("azure", csv, {}, name="x")
    assert str(caught.value).startswith(f"{csv}:3: unreadable timestamp or token count: 2023-11-16 18:15:47.0,3")


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        # pandas would take the first column as the index, and every value would shift one column left.
        (AZURE_ROW.replace("44", "44,9") + AZURE_ROW, "2: not an Azure trace CSV (the row has more fields than"),
        (AZURE_ROW + "2023-11-16 18:15:47.0,374\n",
         "3: unreadable timestamp or token count: 2023-11-16 18:15:47.0,374,\n"),
        (AZURE_ROW + "2023-11-16 18:15:47.0,1" + "0" * 30 + ",44\n",
         "3: ContextTokens must be a whole number from 1 to 10,000,000, got 1" + "0" * 30),
    ],
)  # fmt: skip
def test_an_azure_row_that_does_not_fit_the_header_is_named_as_the_file_has_it(
    tmp_path: Path, rows: str, problem: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(AZURE_HEADER + rows)
    with pytest.raises(WorkloadError) as caught:
        import_trace("azure", path, {}, name="x")
    assert (str(caught.value) + "\n").startswith(f"{path}:{problem}")


GOOD_MOONCAKE = {"timestamp": 9, "input_length": 300, "output_length": 9, "hash_ids": [7]}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"hash_ids": None}, "missing field(s) hash_ids"),
        ({"input_length": -5}, "input_length must be a whole number of at least 1, got -5"),
        ({"output_length": 0}, "output_length must be a whole number of at least 1, got 0"),
        ({"hash_ids": 7}, "hash_ids must be a list of block ids, got 7"),
        ({"timestamp": "soon"}, "timestamp must be a number of milliseconds, got 'soon'"),
        # An integer past a float: quoted in 40 characters, not 400 digits nor an OverflowError's traceback.
        (
            {"timestamp": 10**400},
            "timestamp must be a number of milliseconds, got 1000000000000000000000000000000000000...",
        ),
    ],
)
def test_a_mooncake_row_with_a_missing_or_invalid_value_is_reported_not_changed(
    tmp_path: Path, change: dict[str, object], problem: str
) -> None:
    row = json.dumps({k: v for k, v in {**GOOD_MOONCAKE, **change}.items() if v is not None})
    path = tmp_path / "trace.jsonl"
    good = (DATA / "mooncake.jsonl").read_text().splitlines()[0]
    path.write_text(f"{good}\n\n{row}\n{good}\n")
    with pytest.raises(WorkloadError) as caught:
        import_trace("mooncake", path, {}, name="x")
    assert str(caught.value).startswith(f"{path}:3: {problem}")


@pytest.mark.parametrize("name", ["llama-server.log", "llama-server.journal"])
def test_a_llama_server_log_becomes_sessions_with_history_where_the_slot_cache_held_the_last_turn(name: str) -> None:
    first, other, follow_up = import_trace("llama-server-log", DATA / name, {}, name="log").requests
    assert (first.prompt.new_tokens, first.output_tokens) == (100, 20)
    assert follow_up.session == first.session != other.session and follow_up.turn == 1
    # Task 30 held 143 tokens with 10 generated: a 134-token prompt of which 15 were computed.
    assert (follow_up.prompt.history_tokens, follow_up.prompt.new_tokens) == (119, 15)
    assert follow_up.think_s == pytest.approx(4.0, abs=1e-3)
    assert follow_up.offset_s == pytest.approx(4.8, abs=1e-3)


def test_openai_logs_rebuild_sessions_and_the_shared_system_prompt_without_keeping_text() -> None:
    trace = import_trace("openai-log", DATA / "openai-log.jsonl", {}, name="gw")
    first, other, follow_up = trace.requests
    assert follow_up.session == first.session != other.session and follow_up.turn == 1
    assert first.prompt.shared_prefix[0].block == other.prompt.shared_prefix[0].block
    assert follow_up.prompt.history_tokens == 40 + 12 - first.prompt.shared_prefix[0].tokens
    assert follow_up.think_s == pytest.approx(19.0) and follow_up.offset_s == pytest.approx(20.5)
    assert (first.tag, other.tag) == ("support", "chat")
    assert "router" not in dump_trace(trace) and "ACME" not in dump_trace(trace)


def test_a_bad_line_is_named_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    good = (DATA / "openai-log.jsonl").read_text().splitlines()[0]
    path.write_text(good + "\n" + good.replace('"usage"', '"use"') + "\n")
    with pytest.raises(WorkloadError, match=r"log.jsonl:2: response.usage.prompt_tokens is missing"):
        import_trace("openai-log", path, {}, name="x")


def test_an_unknown_importer_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="valid kinds: azure, llama-server-log, mooncake, openai-log"):
        import_trace("sharegpt", DATA / "azure.csv", {}, name="x")


def test_an_import_is_written_whole_and_reads_back(tmp_path: Path) -> None:
    from tuner.cli import main

    out = tmp_path / "imported.jsonl"
    assert main(["workload", "import", "mooncake", str(DATA / "mooncake.jsonl"), "--out", str(out)]) == 0
    assert len(load_trace(out).requests) == 3
    assert main(["workload", "import", "mooncake", str(DATA / "azure.csv"), "--out", str(tmp_path / "x.jsonl")]) == 2
    assert not (tmp_path / "x.jsonl").exists()


def test_mooncake_block_ids_that_only_look_like_numbers_are_names(tmp_path: Path) -> None:
    # "--5" and a 30-digit id are names, not numbers: counted as blocks, never a traceback.
    from tuner.importers import import_trace

    source = tmp_path / "mc.jsonl"
    rows = [
        {"timestamp": at, "input_length": 1100, "output_length": 5, "hash_ids": ["--5", "1" * 30, 5]} for at in (0, 10)
    ]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    trace = import_trace("mooncake", source, {}, name="mc")
    assert [block for block, _ in trace.prefix_blocks(1)] == ["mc---5", f"mc-{'1' * 30}", "mc-5"]


def test_mooncake_ids_5_and_quoted_5_are_one_block_and_05_another(tmp_path: Path) -> None:
    # A prefix stops at the first id no other request names: "05" is named once, though numpy reads it as 5.
    from tuner.importers import import_trace

    source = tmp_path / "mc.jsonl"
    ids = [[5, 6, 7], ["5", 6, "05"], [5, "6", 9]]
    source.write_text(
        "".join(
            json.dumps({"timestamp": at, "input_length": 1536, "output_length": 5, "hash_ids": row}) + "\n"
            for at, row in enumerate(ids)
        )
    )
    trace = import_trace("mooncake", source, {}, name="mc")
    assert [[block for block, _ in trace.prefix_blocks(i)] for i in range(3)] == [
        ["mc-5", "mc-6"], ["mc-5", "mc-6"], ["mc-5", "mc-6"]
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "text", "named"),
    [
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 20000000, "output_length": 5, "hash_ids": [1]}\n',
            r":1: 20000000 new prompt tokens: a request has 0 to 10,000,000",
        ),
        (
            "mooncake",
            '{"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [1]}\n'
            '{"timestamp": 99999999999, "input_length": 20, "output_length": 5, "hash_ids": [2]}\n',
            r":2: arrives 1e\+08 s after the trace's first request; a trace spans at most 366 days",
        ),
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,5,20000001\n",
            r":2: GeneratedTokens must be a whole number from 1 to 10,000,000, got 20000001",
        ),
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,5,2\n2026-05-10 00:00:00,5,2\n",
            r":3: arrives 6.3072e\+07 s after the trace's first request",
        ),
    ],
)
def test_a_row_past_a_traces_limits_is_named_at_its_line_not_a_traceback(
    tmp_path: Path, kind: str, text: str, named: str
) -> None:
    from tuner.errors import WorkloadError
    from tuner.importers import import_trace

    source = tmp_path / "source"
    source.write_text(text)
    with pytest.raises(WorkloadError, match=named):
        import_trace(kind, source, {}, name="t")


def test_an_imported_request_is_stored_as_its_model_would_be() -> None:
    # The importers add requests without a model; what is stored must be what the model would store.
    from tuner.workloads import PrefixBlock, PromptShape, Trace, TraceBuilder, TraceHeader, TraceRequest, trace_lines

    header = TraceHeader(format="serve-tuner-trace", version=1, name="t")
    shapes = [(0.0, 5, 3, []), (1.25, 0, 7, [("a", 512), ("b", 40)]), (2.5, 9, 1, [("a", 100), ("c", 512)])]
    fast = TraceBuilder(header)
    for index, (offset, new, output, blocks) in enumerate(shapes):
        fast.add_own_session(f"r{index}", offset_s=offset, new_tokens=new, output_tokens=output, tag="x", blocks=blocks)
    models = [
        TraceRequest(
            id=f"r{index}",
            offset_s=offset,
            session=f"r{index}",
            prompt=PromptShape(shared_prefix=[PrefixBlock(block=b, tokens=t) for b, t in blocks], new_tokens=new),
            output_tokens=output,
            tag="x",
        )
        for index, (offset, new, output, blocks) in enumerate(shapes)
    ]
    built = fast.build()
    assert list(built.requests) == models
    assert b"".join(trace_lines(built)) == b"".join(trace_lines(Trace(header=header, requests=models)))


def test_block_names_coded_a_batch_at_a_time_read_back_as_named_with_each_blocks_first_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A million-row trace's blocks are coded in batches; with batches of 3 uses, names recur across many.
    import random

    from tuner.workloads import TraceBuilder, TraceHeader
    from tuner.workloads.columns import BlockCoder

    monkeypatch.setattr(BlockCoder, "BATCH", 3)
    rng = random.Random(7)
    requests = [[(f"b{rng.randrange(12)}", rng.choice([512, 512, 512, 40])) for _ in range(rng.randrange(5))]
                for _ in range(60)]  # fmt: skip
    builder = TraceBuilder(TraceHeader(format="serve-tuner-trace", version=1, name="t"))
    for index, blocks in enumerate(requests):
        builder.add_own_session(f"r{index}", offset_s=index, new_tokens=1, output_tokens=1, tag="x", blocks=blocks)
    built = builder.build()
    assert [built.prefix_blocks(i) for i in range(len(requests))] == requests
    # Codes in the order first named, one name a code, as the dict of names they replace gave them.
    first_named = list(dict.fromkeys(name for blocks in requests for name, _ in blocks))
    _, codes = built.prefix_columns()
    assert list(built._prefix_names) == first_named
    assert codes.tolist() == [first_named.index(name) for blocks in requests for name, _ in blocks]


def test_blocks_coded_by_an_importer_read_back_by_their_preset_names_and_bad_codes_are_refused() -> None:
    from tuner.workloads import TraceBuilder, TraceHeader

    builder = TraceBuilder(TraceHeader(format="serve-tuner-trace", version=1, name="t"))
    with pytest.raises(ValueError, match="preset them first"):
        builder.add_coded_session("r0", offset_s=0.0, new_tokens=1, output_tokens=1, tag="x", codes=[0], tokens=[5])
    builder.preset_block_names(["mc-7", "mc-9", "mc-11"])
    builder.add_coded_session(
        "r0", offset_s=0.0, new_tokens=0, output_tokens=1, tag="x", codes=[2, 0], tokens=[512, 40]
    )
    builder.add_coded_session(
        "r1", offset_s=1.0, new_tokens=3, output_tokens=1, tag="x", codes=[2, 0], tokens=[512, 512]
    )
    with pytest.raises(ValueError, match="one each"):
        builder.add_coded_session("r2", offset_s=2.0, new_tokens=1, output_tokens=1, tag="x", codes=[3], tokens=[5])
    with pytest.raises(ValueError, match="block mc-9 of 0 tokens"):
        builder.add_coded_session("r2", offset_s=2.0, new_tokens=1, output_tokens=1, tag="x", codes=[1], tokens=[0])
    with pytest.raises(ValueError, match="preset: add blocks with add_coded_session"):
        builder.add_own_session("r2", offset_s=2.0, new_tokens=1, output_tokens=1, tag="x", blocks=[("mc-9", 5)])
    with pytest.raises(ValueError, match="preset before the first block"):  # codes would name other blocks
        builder.preset_block_names(["mc-7"])
    built = builder.build()
    assert len(built) == 2
    assert [built.prefix_blocks(i) for i in range(2)] == [
        [("mc-11", 512), ("mc-7", 40)],
        [("mc-11", 512), ("mc-7", 512)],
    ]


def test_two_block_names_whose_first_hashes_are_equal_keep_their_own_codes() -> None:
    from array import array

    import numpy as np

    from tuner.workloads.columns import BlockCoder

    coder = BlockCoder()
    # Keys seen before, by code: (5, 1), (3, 9), (5, 2); two share their first half, as names next to never do.
    coder._keys_a, coder._keys_b = array("q", [5, 3, 5]), array("i", [1, 9, 2])
    coder._by_key = np.array([1, 0, 2], np.int32)
    known = coder._known(np.array([5, 5, 5, 3, 4], np.int64), np.array([2, 1, 7, 9, 9], np.int32))
    assert known.tolist() == [2, 0, -1, 1, -1]


def test_an_imported_value_that_is_not_a_whole_number_is_refused_before_anything_is_stored() -> None:
    from tuner.workloads import TraceBuilder, TraceHeader

    builder = TraceBuilder(TraceHeader(format="serve-tuner-trace", version=1, name="t"))
    with pytest.raises(ValueError, match=r"2\.5 new prompt tokens: a whole number"):
        builder.add_own_session("r0", offset_s=0.0, new_tokens=2.5, output_tokens=1, tag="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"block a of 2\.0 tokens"):
        builder.add_own_session("r0", offset_s=0.0, new_tokens=1, output_tokens=1, tag="x", blocks=[("a", 2.0)])  # type: ignore[list-item]
    assert len(builder) == 0
