"""What real IFCSUM senders send, and case study 2's parser reads (pure, no broker).

Three interchanges written for these tests, each in the shape of a kind of published
sample (none copied): a road carrier's D96A in ISO 8859-1 (UNOC) with one segment per
line, a forwarder's D94B in UNOA, a forwarder's D98B in UTF-8 (UNOY) behind a byte order
mark. Between them they hold every variant the parser once refused: an ``NAD`` with only
a party code or only unstructured name-and-address lines, a B/L in the ``CNI`` document
number, weights as ``MEA+WT+AAD`` and ``MEA+WT+G`` (in KGM and TNE), a B/L number with a
space, and one container with a bad check digit among good ones. Each rejection that is
left keeps its precise reason.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from case_studies.bl_ingestion import writeup
from case_studies.bl_ingestion.manifest import (UTF8_BOM, Consignment, MalformedInterchange, MalformedSegment,
                                                MissingBillOfLading, UnitRejected, consignment_key, decode_interchange,
                                                encode_interchange, envelope, parse_unit, split)


def interchange(syntax: str, message: str, body: list[str], sep: str = "") -> str:
    """``body`` (segments without their terminator) inside UNA, UNB, UNH .. UNT (its count made here), UNZ."""
    segments = [f"UNH+M1+IFCSUM:D:{message}:UN", *body]
    segments.append(f"UNT+{len(segments) + 1}+M1")
    lines = ["UNA:+.? '", f"UNB+{syntax}:3+SENDER01:ZZZ+TERMINAL:ZZZ+250314:0615+CTRL{message}'",
             *(s + "'" for s in segments), f"UNZ+1+CTRL{message}'"]
    return sep.join(lines)


ROAD_D96A = interchange("UNOC", "96A", [
    "BGM+610+ROAD250314+9", "DTM+137:202503140600:203", "TDT+20+R77+3++FRIGOTRANS:172:ZZZ",
    "CNI+1+CMR2503140001",  # the B/L (here a CMR number) in the CNI's document number; no RFF+BM
    "NAD+CZ+5790000110018::9",  # the shipper by its GS1 party code alone
    "NAD+CN++SCHÖNE MÖBEL GMBH:HAFENSTRASSE 3:20457 HAMBURG",  # unstructured lines alone, in ISO 8859-1
    "GID+1+12:PX", "MEA+WT+AAD+KGM:4310.5",  # the consignment's gross weight
    "CNI+2+CMR2503140002",
    "NAD+CZ++TRÄSLÖJD AB:STORGATAN 1:VÄXJÖ", "NAD+CN+7310000000019::9",
    "GID+1+3:PX", "MEA+WT+G+KGM:800", "GID+2+1:CS", "MEA+WT+G+KGM:75,5",  # goods items' weights, a decimal comma
    "CNI+3", "RFF+BN:BK889", "NAD+CZ+5790000110018::9",  # a booking and no B/L anywhere
], sep="\r\n")
FORWARDER_D94B = interchange("UNOA", "94B", [
    "BGM+785+FWD0094+9",
    "CNI+1", "RFF+BM:HLCUHAM250300417", "NAD+CZ+DE811907980::ZZZ", "NAD+CN++NORDIC TIMBER AB:BOX 12:GOTHENBURG",
    "GID+1+40:PK", "MEA+WT+AAD+TNE:18.2",  # tonnes
    "EQD+CN+MSKU9070323+45G1", "EQD+CN+TGHU6271040+45G1",  # the second's check digit should be 9
    "CNI+2", "RFF+BM:HLCUHAM250300418", "NAD+CZ", "GID+1+2:CS",  # an NAD that names nobody
])
FORWARDER_D98B = interchange("UNOY", "98B", [
    "BGM+785+FWD0098+9",
    "CNI+1", "RFF+BM:MEDU 4471203",  # a B/L number written with a space
    "NAD+CZ+++ŁÓDŹ LOGISTYKA SP. Z O.O.+UL. PORTOWA 7+ŁÓDŹ++90-001+PL", "NAD+CN+PL7251801126::ZZZ",
    "GID+1+6:PX", "MEA+WT+G+KGM:950", "EQD+CN+CAIU5512300+22G1",
])


def units_of(text: str, codec: str, bom: bool = False) -> list[Consignment | UnitRejected]:
    data = (UTF8_BOM if bom else b"") + text.encode(codec)
    out: list[Consignment | UnitRejected] = []
    for unit in split(data):
        try:
            out.append(parse_unit(unit))
        except UnitRejected as error:
            out.append(error)
    return out


def test_a_road_d96a_in_latin_1_with_a_segment_per_line_parses_as_its_sender_wrote_it() -> None:
    data = ROAD_D96A.encode("iso8859-1")
    assert "Ö".encode("utf-8") not in data and decode_interchange(data) == ROAD_D96A
    first, second, third = units_of(ROAD_D96A, "iso8859-1")
    assert isinstance(first, Consignment) and isinstance(second, Consignment)
    assert (first.bl_number, second.bl_number) == ("CMR2503140001", "CMR2503140002")  # from the CNI
    shipper, consignee = first.party("CZ"), first.party("CN")
    assert shipper is not None and (shipper.code, shipper.name) == ("5790000110018", "")  # a code alone
    assert consignee is not None and consignee.code is None
    assert consignee.name == "SCHÖNE MÖBEL GMBH HAFENSTRASSE 3 20457 HAMBURG"  # the lines alone, as sent
    assert first.gross_weight_kg == Decimal("4310.5") and first.containers == ()  # a truck: no container
    assert second.gross_weight_kg == Decimal("875.5")  # the items' sum
    assert (second.party("CZ") or shipper).name.startswith("TRÄSLÖJD AB")
    assert isinstance(third, MissingBillOfLading) and third.reason == "booking_only"
    assert consignment_key("SENDER01", "CMR2503140001") == consignment_key(split(data)[0])


def test_the_writeups_decoding_with_replacement_loses_the_latin_1_names() -> None:
    text = ROAD_D96A.encode("iso8859-1").decode("utf-8", errors="replace")  # writeup.dispatch_manifest's decode
    assert "SCH\ufffdNE M\ufffdBEL" in text
    pieces = writeup.split_units(text)
    assert len(pieces) == 3 and [writeup.bl_number_of(p, "B", i) for i, p in enumerate(pieces)] == ["B-0", "B-1",
                                                                                                     "B-2"]


def test_a_d94b_refuses_the_bad_container_not_its_bl_and_names_a_party_that_is_nobody() -> None:
    first, second = units_of(FORWARDER_D94B, "ascii")
    assert isinstance(first, Consignment) and first.bl_number == "HLCUHAM250300417"
    assert first.containers == ("MSKU9070323",) and first.gross_weight_kg == Decimal("18200.0")
    [refused] = first.rejected_containers
    assert (refused.number, refused.reason) == ("TGHU6271040", "bad_check_digit") and "gives 9" in refused.detail
    shipper = first.party("CZ")
    assert shipper is not None and shipper.code == "DE811907980" and shipper.name == ""
    assert isinstance(second, MalformedSegment) and second.reason == "malformed_segment"
    assert second.bl_number == "HLCUHAM250300418" and second.detail.startswith("NAD+CZ identifies no party")


def test_a_d98b_in_utf_8_behind_a_byte_order_mark_keeps_its_names_and_its_bl_with_a_space() -> None:
    [only] = units_of(FORWARDER_D98B, "utf-8", bom=True)
    assert isinstance(only, Consignment) and only.bl_number == "MEDU 4471203"
    shipper = only.party("CZ")
    assert shipper is not None and (shipper.name, shipper.city, shipper.country) == (
        "ŁÓDŹ LOGISTYKA SP. Z O.O.", "ŁÓDŹ", "PL")
    assert only.containers == ("CAIU5512300",) and only.gross_weight_kg == Decimal(950)
    assert envelope("\ufeff" + FORWARDER_D98B).carrier == "SENDER01"  # a BOM decoded along with the text
    assert writeup.bl_number_of(split(FORWARDER_D98B)[0].raw, "B", 0) == "MEDU"  # the write-up's regex cuts it


@pytest.mark.parametrize(("syntax", "codec"), [("UNOA", "ascii"), ("UNOB", "ascii"), ("UNOC", "iso8859-1"),
                                               ("UNOY", "utf-8"), ("UNOW", "utf-8")])
def test_each_syntax_identifier_decodes_in_its_character_set(syntax: str, codec: str) -> None:
    text = interchange(syntax, "96A", ["CNI+1+BL1", "NAD+CZ++" + ("Å" if codec != "ascii" else "A")])
    assert encode_interchange(text) == text.encode(codec)
    assert decode_interchange(text.encode(codec)) == text


def test_bytes_outside_the_named_character_set_or_an_unknown_one_refuse_the_interchange_with_the_reason() -> None:
    latin = interchange("UNOA", "94B", ["CNI+1+BL1", "NAD+CZ++CAFÉ DU PORT"]).encode("iso8859-1")
    with pytest.raises(MalformedInterchange) as caught:
        split(latin)
    offset = latin.index(b"\xc9")
    assert caught.value.reason == "bad_encoding"
    assert caught.value.detail == f"byte 0xC9 at offset {offset} is not UNOA (ascii), the character set the UNB names"
    with pytest.raises(MalformedInterchange) as unknown:
        split(interchange("UNOX", "94B", ["CNI+1+BL1"]).encode("ascii"))
    assert unknown.value.reason == "bad_encoding" and unknown.value.detail.startswith("the UNB syntax identifier UNOX")
    with pytest.raises(MalformedInterchange) as none:
        split(b"UNH+1+IFCSUM:D:96A:UN'")
    assert none.value.reason == "malformed_interchange"


def test_a_unit_with_neither_rff_bm_nor_a_cni_document_number_is_still_refused_as_before() -> None:
    with pytest.raises(MissingBillOfLading) as caught:
        parse_unit("CNI+1'NAD+CZ+5790000110018::9'")
    assert caught.value.reason == "no_reference"
    assert parse_unit("CNI+1+CMR1'RFF+BM:BL9'NAD+CZ+5790000110018::9'").bl_number == "BL9"  # RFF+BM wins
