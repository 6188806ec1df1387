"""runtime.units: one format per kind of number, with the values worked out by hand."""

from __future__ import annotations

import pytest

from runtime.units import GIB, KIB, MIB, fmt_bytes, fmt_count, fmt_duration, fmt_latency, fmt_rate


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"),
    (1, "1 B"),
    (512, "512 B"),
    (1023, "1,023 B"),  # below 1 KiB: whole bytes, with the thousands comma
    (1023.6, "1.00 KiB"),  # rounds to 1,024 B, so it is the next unit
    (1024, "1.00 KiB"),
    (1536, "1.50 KiB"),
    (10 * KIB, "10.0 KiB"),
    (999 * KIB, "999 KiB"),
    (1023 * KIB, "1,023 KiB"),
    (1536 * KIB, "1.50 MiB"),
    (96_576_768, "92.1 MiB"),  # SmolLM2-135M Q4_1's tensors; llama.cpp logs 92.10 MiB
    (98_362_432, "93.8 MiB"),  # the default model's file: "98 MB" in decimal units
    (180 * MIB, "180 MiB"),
    (512 * MIB, "512 MiB"),
    (GIB, "1.00 GiB"),  # exact GiB
    (3 * GIB, "3.00 GiB"),
    (4_683_073_536, "4.36 GiB"),
    (int(9.996 * GIB), "10.0 GiB"),  # rounds up into the next precision, not "10.00"
    (24 * GIB, "24.0 GiB"),
    (int(99.96 * GIB), "100 GiB"),
    (1023 * GIB, "1,023 GiB"),
    (1024 * GIB, "1.00 TiB"),
    (1 << 50, "1.00 PiB"),
    (1 << 70, "1,048,576 PiB"),  # beyond the last unit: the number grows, the unit stays
])
def test_bytes_read_in_binary_units_with_three_significant_digits(n: float, text: str) -> None:
    assert fmt_bytes(n) == text


def test_a_shortfall_keeps_its_sign_and_an_unknown_size_reads_as_a_question_mark() -> None:
    assert fmt_bytes(-1536) == "-1.50 KiB"
    assert fmt_bytes(-512) == "-512 B"
    assert fmt_bytes(None) == "?"


def test_a_caller_chooses_the_precision_not_the_format() -> None:
    size = 4_683_073_536  # 4.3614 GiB
    assert [fmt_bytes(size, digits=d) for d in (1, 2, 3, 4)] == \
        ["4 GiB", "4.4 GiB", "4.36 GiB", "4.361 GiB"]
    assert fmt_bytes(98 * MIB + 200 * KIB, digits=2) == "98 MiB"
    assert fmt_bytes(512, digits=1) == "512 B"  # bytes are whole whatever the precision
    with pytest.raises(ValueError, match="at least 1"):
        fmt_bytes(1, digits=0)


@pytest.mark.parametrize(("n", "text"), [
    (None, "?"), (0, "?"), (512, "512"), (1_500, "1.5K"), (134_515_008, "135M"),
    (7_615_616_512, "7.6B"), (70_553_706_496, "71B"), (1_200_000_000_000, "1.2T"),
])
def test_counts_read_as_model_names_write_them(n: int | None, text: str) -> None:
    assert fmt_count(n) == text


@pytest.mark.parametrize(("rate", "text"), [
    (0.0, "0.0 tok/s"), (67.62, "67.6 tok/s"), (99.94, "99.9 tok/s"), (176.24, "176 tok/s"),
    (12345.6, "12,346 tok/s"),
])
def test_rates_keep_a_decimal_below_one_hundred(rate: float, text: str) -> None:
    assert fmt_rate(rate) == text


def test_a_rate_in_another_unit() -> None:
    assert fmt_rate(12.5, "MiB/s") == "12.5 MiB/s"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (-3, "0 s"), (45.9, "45 s"), (59, "59 s"), (60, "1 min 00 s"),
    (187, "3 min 07 s"), (3599, "59 min 59 s"), (3600, "1 h 00 min"), (3900, "1 h 05 min"),
    (90_000, "25 h 00 min"),
])
def test_durations_count_whole_seconds_minutes_and_hours(seconds: float, text: str) -> None:
    assert fmt_duration(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0 ms"), (0.0004, "0 ms"), (0.2134, "213 ms"), (0.9994, "999 ms"),
    (0.9996, "1.00 s"), (1.5, "1.50 s"), (12.345, "12.35 s"),
])
def test_latencies_read_in_milliseconds_below_a_second(seconds: float, text: str) -> None:
    assert fmt_latency(seconds) == text
