"""Bulk B/L ingestion's domain (pure, no broker): the synthetic IFCSUM manifest, its split and
parse, the keys, and the JSON log lines.

One 4,000-consignment manifest (a deviation every 10th consignment) is generated and split
once for the module; the parse checks run on its first 400 units and on small manifests
that place each deviation where a test wants it.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog
from stdnum import iso6346

from case_studies.bl_ingestion import logs
from case_studies.bl_ingestion.manifest import (DEVIATION_KINDS, BadContainerNumber, Consignment, DeviationKind,
                                                Deviations,
                                                Manifest, MalformedInterchange, MalformedSegment,
                                                MissingBillOfLading, Unit, UnitRejected, bill_of_lading,
                                                check_containers, consignment_key, envelope, generate, parse_unit,
                                                split, unit_key)
from case_studies.bl_ingestion import writeup

SEED = 20_250_101
BIG = 4_000
EVERY = 10


@pytest.fixture(scope="module")
def big() -> Manifest:
    return generate(SEED, BIG, Deviations(every=EVERY))


@pytest.fixture(scope="module")
def big_units(big: Manifest) -> list[Unit]:
    return split(big.text)


def outcome(unit: Unit) -> Consignment | UnitRejected:
    try:
        return parse_unit(unit)
    except UnitRejected as error:
        return error


def rejection(unit: Unit) -> UnitRejected:
    with pytest.raises(UnitRejected) as caught:
        parse_unit(unit)
    return caught.value


def one_of_each() -> Manifest:
    """Every deviation kind three times (each variant of escaped_text and malformed), clean ones between."""
    kinds: list[DeviationKind] = [kind for kind in DEVIATION_KINDS for _ in range(3)]
    at: dict[int, DeviationKind] = {3 + 2 * n: kind for n, kind in enumerate(kinds)}
    return generate(SEED, 3 + 2 * len(at), Deviations(at=at))


# --- the generator ------------------------------------------------------------------------------------------------

def test_the_same_seed_gives_the_same_manifest_and_another_seed_another() -> None:
    first, again = generate(SEED, 50, Deviations(every=7)), generate(SEED, 50, Deviations(every=7))
    assert first == again
    assert generate(SEED + 1, 50, Deviations(every=7)).text != first.text
    named = generate(SEED, 50, Deviations(every=7), batch_id="RUN-1")
    assert named.batch_id == "RUN-1" and first.batch_id == envelope(first.text).batch_id and named.text == first.text


def test_a_deviation_changes_its_own_consignment_and_nothing_else() -> None:
    clean, deviated = generate(SEED, 30), generate(SEED, 30, Deviations(at={7: "escaped_text", 12: "bad_check_digit"}))
    clean_units, deviated_units = split(clean.text), split(deviated.text)
    changed = [i for i, (a, b) in enumerate(zip(clean_units, deviated_units, strict=True)) if a.raw != b.raw]
    assert changed == [7, 12]
    assert clean.batch_id == deviated.batch_id


def test_deviations_every_nth_take_the_kinds_in_turn_and_explicit_indices_win() -> None:
    deviations = Deviations(every=4, kinds=("no_reference", "malformed"), at={3: "escaped_text", 5: "booking_only"})
    assert [deviations.kind(i) for i in range(12)] == [None, None, None, "escaped_text", None, "booking_only", None,
                                                       "malformed", None, None, None, "no_reference"]
    with pytest.raises(ValueError):
        Deviations(every=-1)
    with pytest.raises(ValueError):
        Deviations(at={-1: "malformed"})


def test_a_4000_consignment_manifest_is_generated_in_well_under_two_seconds() -> None:
    started = time.perf_counter()
    generate(SEED, BIG, Deviations(every=EVERY))
    took = time.perf_counter() - started
    assert took < 2.0, f"generating {BIG} consignments took {took:.2f}s"


def test_the_interchange_has_its_envelope_and_counts(big: Manifest) -> None:
    text = big.text
    assert text.startswith("UNA:+.? 'UNB+UNOC:3+")
    assert "UNH+1+IFCSUM:D:99B:UN'" in text
    env = envelope(text)
    assert (env.carrier, env.batch_id) == (big.carrier, big.batch_id)
    assert text.endswith(f"UNZ+1+{env.control_ref}'")
    unt = re.search(r"UNT\+(\d+)\+1'", text)
    assert unt is not None and int(unt.group(1)) > BIG  # UNH..UNT counted; split() checks the exact number


# --- the split ----------------------------------------------------------------------------------------------------

def test_4000_consignments_split_into_4000_units_in_order(big: Manifest, big_units: list[Unit]) -> None:
    assert len(big_units) == len(big.truth) == BIG
    assert [u.index for u in big_units] == list(range(BIG))
    assert all(u.carrier == big.carrier and u.raw.startswith(f"CNI+{u.index + 1}'") for u in big_units)
    assert "".join(u.raw for u in big_units) in big.text  # re-serialised, each group is the text that was sent


def test_a_naive_split_on_cni_text_finds_consignments_that_are_not_there(big: Manifest,
                                                                          big_units: list[Unit]) -> None:
    escaped = sum(1 for e in big.truth if e.deviation == "escaped_text")
    naive = writeup.split_units(big.text)  # the write-up's split
    assert escaped == BIG // EVERY // len(DEVIATION_KINDS) and escaped > 0
    assert len(naive) == BIG + escaped != len(big_units)


def test_the_writeups_split_of_the_studys_manifest_makes_a_phantom_unit_booked_under_a_made_up_number() -> None:
    from case_studies.bl_ingestion import study

    manifest = generate(study.SEED, study.MANIFEST_UNITS, Deviations(every=study.DEVIATE_EVERY))
    pieces = writeup.split_units(manifest.text)
    assert len(pieces) == 41 and study.naive_pieces(manifest) == (41, {6, 13, 28})
    assert manifest.truth[27].deviation == "escaped_text"
    assert pieces[27].endswith("NAD+CZ+++SERVEIS D?'ENGINYERIA TE")  # the consignment's own piece: no container
    assert writeup.validate_containers(pieces[27]) == [] and writeup.bl_number_of(pieces[27], "B", 27) == \
        manifest.truth[27].bl_number
    phantom = pieces[28]  # starts inside the shipper's street address, holds the consignment's containers
    assert phantom.startswith("12 HARBOUR ROAD+ROTTERDAM++3011+NL'NAD+CN+++") and "RFF+BM" not in phantom
    assert writeup.bl_number_of(phantom, "B", 28) == "B-28" and len(writeup.validate_containers(phantom)) >= 1
    assert [writeup.bl_number_of(p, "B", i) for i, p in enumerate(pieces)].count("B-28") == 1


def test_the_writeups_regex_truncates_a_bl_number_with_a_space_and_makes_one_up_for_an_empty_one() -> None:
    assert writeup.bl_number_of("1'RFF+BM:MEDU 1234567'EQD+CN+BLTU1234568+22G1'", "B", 0) == "MEDU"
    assert writeup.bl_number_of("1'RFF+BM'EQD+CN+BLTU1234568+22G1'", "B", 4) == "B-4"  # no exception: the fallback
    with pytest.raises(ValueError, match="invalid container number 'BLTU1234567'"):
        writeup.validate_containers("1'RFF+BM:X'EQD+CN+BLTU1234567+22G1'")


def test_the_writeups_dispatch_decodes_the_bytes_with_replacement() -> None:
    latin1 = "NAD+CZ+++MÜLLER GMBH'".encode("latin-1")  # what a UNOC (ISO 8859-1) sender's bytes hold
    assert latin1.decode("utf-8", errors="replace") == "NAD+CZ+++M\ufffdLLER GMBH'"  # the name is lost


def test_release_characters_do_not_break_a_unit() -> None:
    manifest = one_of_each()
    units = split(manifest.text)
    assert len(units) == len(manifest.truth)
    pieces = [p for p in manifest.text.split("'") if p.startswith("CNI+")]  # a naive split on the terminator
    assert len(pieces) > len(units)
    escaped = [u for u, e in zip(units, manifest.truth) if e.deviation == "escaped_text"]
    assert len(escaped) == 3 and all("?'" in u.raw for u in escaped)
    assert sum("CNI?+" in u.raw for u in escaped) == 1  # released: data, not a segment
    shippers = [p.name for u in escaped for p in parse_unit(u).parties if p.role == "CZ"]
    assert "SERVEIS D'ENGINYERIA TECNI" in shippers  # sent as D?'ENGINYERIA TECNI+<street>


def test_a_unit_survives_json_as_the_wire_carries_it(big_units: list[Unit]) -> None:
    unit = big_units[17]
    assert Unit.model_validate(json.loads(json.dumps(unit.model_dump()))) == unit
    assert parse_unit(unit.raw).bl_number == parse_unit(unit).bl_number


MANGLED: list[tuple[Callable[[str], str], str]] = [
    (lambda t: t[: t.rindex("UNT+")], "without its UNZ"),
    (lambda t: re.sub(r"UNT\+(\d+)", lambda m: f"UNT+{int(m.group(1)) - 1}", t), "UNT of message"),
    (lambda t: t.replace("UNZ+1+", "UNZ+2+"), "UNZ counts 2"),
    (lambda t: t[t.index("UNH+"):], "does not start with a UNB"),
    (lambda t: t[:-1], "not an EDIFACT interchange"),
]


@pytest.mark.parametrize(("mangle", "says"), MANGLED)
def test_a_manifest_that_is_not_whole_is_refused_whole(mangle: Callable[[str], str], says: str) -> None:
    text = generate(SEED, 5).text
    with pytest.raises(MalformedInterchange) as caught:
        split(mangle(text))
    assert caught.value.reason == "malformed_interchange" and says in caught.value.detail


# --- the parse ----------------------------------------------------------------------------------------------------

def test_each_unit_parses_or_is_rejected_as_its_ground_truth_says(big: Manifest, big_units: list[Unit]) -> None:
    for expected, unit in zip(big.truth[:400], big_units[:400], strict=True):
        result = outcome(unit)
        if expected.reason is None:
            assert isinstance(result, Consignment), (expected, result)
            assert (result.bl_number, result.carrier, result.index) == (expected.bl_number, big.carrier, unit.index)
            assert result.containers or result.rejected_containers
            assert result.goods_items >= 1 and result.gross_weight_kg > 0
            assert bool(result.rejected_containers) == (expected.deviation == "bad_check_digit")
            assert result.party("CZ") is not None and result.party("CN") is not None
        else:
            assert isinstance(result, UnitRejected) and result.reason == expected.reason, (expected, result)


def test_a_booking_reference_without_a_bill_of_lading_is_rejected_with_its_reason() -> None:
    manifest = generate(SEED, 3, Deviations(at={1: "booking_only"}))
    error = rejection(split(manifest.text)[1])
    assert isinstance(error, MissingBillOfLading) and error.reason == "booking_only" and error.bl_number is None
    assert "booking reference RFF+BN but no bill of lading RFF+BM" in str(error)


def test_no_reference_at_all_is_rejected_with_its_reason() -> None:
    manifest = generate(SEED, 3, Deviations(at={1: "no_reference"}))
    unit = split(manifest.text)[1]
    assert "RFF+" not in unit.raw
    error = rejection(unit)
    assert isinstance(error, MissingBillOfLading) and error.reason == "no_reference"
    assert str(error) == "no RFF+BM bill of lading reference"


def test_a_bad_check_digit_refuses_that_container_naming_the_digit_iso_6346_gives_and_not_the_bl() -> None:
    manifest = generate(SEED, 3, Deviations(at={1: "bad_check_digit"}))
    unit = split(manifest.text)[1]
    numbers = re.findall(r"EQD\+CN\+(\w+)\+", unit.raw)
    number = numbers[0]
    assert not iso6346.is_valid(number)
    consignment = parse_unit(unit)
    assert consignment.bl_number == manifest.truth[1].bl_number and consignment.containers == tuple(numbers[1:])
    [refused] = consignment.rejected_containers
    assert (refused.number, refused.reason) == (number, "bad_check_digit")
    assert number in refused.detail and f"gives {iso6346.calc_check_digit(number[:10])}" in refused.detail
    with pytest.raises(BadContainerNumber) as caught:
        check_containers(unit)  # the container check alone still refuses it, with the B/L named
    assert caught.value.bl_number == manifest.truth[1].bl_number


def test_each_malformed_segment_is_named() -> None:
    manifest = one_of_each()
    units = split(manifest.text)
    details = [rejection(u) for u, e in zip(units, manifest.truth) if e.deviation == "malformed"]
    assert all(isinstance(e, MalformedSegment) and e.reason == "malformed_segment" and e.bl_number for e in details)
    assert sorted(re.sub(r"'.*'", "...", e.detail).split(" ")[0] for e in details) == ["EQD+CN", "GID+1:",
                                                                                       "MEA+AAE+G"]


def test_a_released_apostrophe_before_una_in_free_text_is_data() -> None:
    raw = "CNI+1'RFF+BM:BLTC000000001'FTX+AAI+++NOTE?'UNAVAILABLE UNTIL MONDAY+EN'EQD+CN+BLTU1234568+22G1+++5'"
    assert parse_unit(raw).containers == ("BLTU1234568",)  # pydifact alone reads ?'UNA as a service string advice


def test_text_that_is_not_a_unit_is_malformed() -> None:
    for raw in ("RFF+BM:X'", "CNI+1'RFF+BM:X", "CNI+1'RFF+BM:X'CNI+2'"):
        with pytest.raises(MalformedSegment):
            parse_unit(raw)


def test_every_container_of_a_good_unit_passes_iso_6346(big: Manifest, big_units: list[Unit]) -> None:
    good = [u for u, e in zip(big_units[:400], big.truth) if e.deviation is None]
    numbers = [n for u in good for n in check_containers(u)]
    assert len(numbers) >= len(good) and all(iso6346.is_valid(n) for n in numbers)


def test_a_rejection_pickles_and_reads_as_its_sentence() -> None:
    error = BadContainerNumber("bad_check_digit", "container X has check digit 1; ISO 6346 gives 2", "BL1")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is BadContainerNumber and (again.reason, again.detail, again.bl_number) == (
        error.reason, error.detail, error.bl_number)
    assert str(again) == error.detail


# --- the keys -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sent_twice() -> tuple[Manifest, list[Unit], Manifest, list[Unit]]:
    first, resent = generate(SEED, 40, Deviations(every=5)), generate(SEED, 40, Deviations(every=5), resend=1)
    return first, split(first.text), resent, split(resent.text)


def test_a_resent_manifest_has_a_new_batch_id_and_its_units_another_eta(
        sent_twice: tuple[Manifest, list[Unit], Manifest, list[Unit]]) -> None:
    first, units, resent, again = sent_twice
    assert first.batch_id != resent.batch_id and first.truth == resent.truth

    def without_dtm(raw: str) -> str:
        return re.sub(r"DTM\+[^']*'", "", raw)

    assert all(a.raw != b.raw and without_dtm(a.raw) == without_dtm(b.raw) for a, b in zip(units, again))


def test_the_consignment_key_is_the_same_in_a_resent_manifest_and_the_writeup_key_is_not(
        sent_twice: tuple[Manifest, list[Unit], Manifest, list[Unit]]) -> None:
    first, units, resent, again = sent_twice
    for expected, a, b in zip(first.truth, units, again):
        if expected.bl_number is None:
            continue
        assert consignment_key(a) == consignment_key(b) == consignment_key(first.carrier, expected.bl_number)
        key = writeup.idempotency_key
        assert key(first.batch_id, expected.bl_number, a.raw) != key(resent.batch_id, expected.bl_number, b.raw)
        assert key(first.batch_id, expected.bl_number, a.raw) != key(first.batch_id, expected.bl_number, b.raw)
    keys = {consignment_key(u) for u, e in zip(units, first.truth) if e.bl_number}
    assert len(keys) == sum(1 for e in first.truth if e.bl_number)  # one key per consignment


def test_the_consignment_key_of_a_parsed_consignment_is_its_units(big_units: list[Unit]) -> None:
    unit = big_units[0]
    assert consignment_key(parse_unit(unit)) == consignment_key(unit)
    assert consignment_key(unit) != consignment_key("ANOTHER", parse_unit(unit).bl_number)
    with pytest.raises(ValueError):
        consignment_key(parse_unit(unit.raw))  # no carrier: the raw text alone does not say it
    assert unit_key(unit) == unit_key(unit.carrier, unit.raw) != consignment_key(unit)


def test_a_unit_without_a_bill_of_lading_has_no_consignment_key_and_the_writeup_makes_one_up(
        sent_twice: tuple[Manifest, list[Unit], Manifest, list[Unit]]) -> None:
    first, units, resent, again = sent_twice
    index = next(e.index for e in first.truth if e.deviation == "booking_only")
    with pytest.raises(MissingBillOfLading):
        consignment_key(units[index])
    assert bill_of_lading(units[index]) is None
    assert writeup.bl_number_of(units[index].raw, first.batch_id, index) == f"{first.batch_id}-{index}"
    assert writeup.bl_number_of(again[index].raw, resent.batch_id, index) == f"{resent.batch_id}-{index}"
    assert writeup.bl_number_of(units[0].raw, first.batch_id, 0) == first.truth[0].bl_number


# --- the log lines ------------------------------------------------------------------------------------------------

def test_each_log_line_is_one_json_object_with_the_keys() -> None:
    stream = io.StringIO()
    log = logs.bl_logger("ACSL-0000000001", "ACSL123456789", stream, unit=3)
    log.warning("unit_rejected", reason="bad_check_digit")
    logs.bl_logger("ACSL-0000000001", None, stream).info("unit_replayed")
    stream.seek(0)
    lines = logs.read_json_lines(stream)
    assert len(lines) == 2 and all(set(logs.LOG_KEYS) <= set(line) for line in lines)
    assert lines[0]["event"] == "unit_rejected" and lines[0]["level"] == "warning" and lines[0]["unit"] == 3
    assert lines[0]["bl_number"] == "ACSL123456789" and lines[1]["bl_number"] is None
    assert lines[0]["timestamp"].endswith("Z")


def test_the_log_ignores_structlogs_global_configuration() -> None:
    structlog.configure(processors=[structlog.processors.KeyValueRenderer()])
    try:
        stream = io.StringIO()
        logs.bl_logger("B", "BL1", stream).info("batch_aggregated", forwarded=2)
        assert json.loads(stream.getvalue())["forwarded"] == 2
    finally:
        structlog.reset_defaults()


def test_the_default_stream_is_stderr_when_the_logger_is_made(capsys: pytest.CaptureFixture[str]) -> None:
    logs.json_logger(batch_id="B").info("dispatched", units=4)
    assert json.loads(capsys.readouterr().err)["units"] == 4


@pytest.fixture
def events_folder(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    logs.close_event_logs()


def test_a_runs_log_is_a_file_read_back_in_order(events_folder: Path) -> None:
    for n in range(3):
        logs.event_log("run-1", events_folder).info("unit_replayed", batch_id="B", bl_number=f"BL{n}")
    assert logs.read_events("run-2", events_folder) == []
    assert [line["bl_number"] for line in logs.read_events("run-1", events_folder)] == ["BL0", "BL1", "BL2"]
    with logs.event_log_path("run-1", events_folder).open("a") as file:
        file.write("not json\n")
    with pytest.raises(ValueError, match=r"bl-run-1.jsonl:4: not a JSON object"):
        logs.read_events("run-1", events_folder)
