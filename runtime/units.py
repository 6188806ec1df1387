"""Sizes, counts, rates and durations as people read them: one format for every screen.

Bytes are binary and named as binary (KiB, MiB, GiB), with three significant digits:

    >>> fmt_bytes(96_576_768), fmt_bytes(4_683_073_536), fmt_bytes(512)
    ('92.1 MiB', '4.36 GiB', '512 B')
    >>> fmt_bytes(180 << 20), fmt_bytes(24 << 30), fmt_bytes(1536), fmt_bytes(1023)
    ('180 MiB', '24.0 GiB', '1.50 KiB', '1,023 B')

Worked through for the first, SmolLM2-135M Q4_1's tensors: 96,576,768 bytes are 94,313 KiB
(not below 1,024, so not KiB) and 92.10 MiB (below 1,024): MiB it is, and three significant
digits leave one decimal, "92.1 MiB" — the figure llama.cpp logs for the same tensors
("CPU_Mapped model buffer size = 92.10 MiB"). The unit is the largest in which the value is
at least 1; the decimals are 2 below 10, 1 below 100, none from 100 on, decided by what the
value rounds to (9.996 GiB reads "10.0 GiB", and 1023.7 KiB "1.00 MiB", never "1,024 KiB").
Bytes are whole, and from 1,000 to 1,023 of a unit the value keeps its unit and takes a
thousands comma ("1,023 B"), as every number in the app does.

Why binary: the planner, llama.cpp's logs and the memory a device reports all count in
2^30-byte gigabytes. A 24 GiB GPU is 25.8 GB; were file sizes decimal and memory binary, a
"25.0 GB" file (23.3 GiB) would look too big for a card it fits. Why three digits: enough to
tell apart two quants of one model that differ by a few per cent, few enough to read in a
table; a caller that needs fewer (a narrow label) passes `digits`, it keeps no formatter of
its own. Why not the formats the code once had ("98 MiB" up to 10 GiB, "512.00 MiB",
"5.0 GiB", "98 MB"): one file read four ways on four screens.

Counts, rates and durations follow the same idea, one rule each:

    >>> fmt_count(134_515_008), fmt_count(7_615_616_512), fmt_count(512)
    ('135M', '7.6B', '512')
    >>> fmt_rate(67.62), fmt_rate(12345.6)
    ('67.6 tok/s', '12,346 tok/s')
    >>> fmt_duration(45), fmt_duration(187), fmt_duration(3900)
    ('45 s', '3 min 07 s', '1 h 05 min')
    >>> fmt_latency(0.2134), fmt_latency(1.5)
    ('213 ms', '1.50 s')

Why two for time: a wait (a download's ETA) is an estimate, whole seconds are all it can
promise; a latency (time to first token) is a measurement where 0.21 s and 0.25 s differ.
"""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_COUNT_UNITS = ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K"))


def fmt_bytes(n: float | None, digits: int = 3) -> str:
    """A byte count in binary units with `digits` significant digits; "?" when unknown.

    fmt_bytes(4_683_073_536) -> '4.36 GiB'; fmt_bytes(4_683_073_536, digits=2) -> '4.4 GiB';
    fmt_bytes(-1536) -> '-1.50 KiB' (a shortfall); fmt_bytes(None) -> '?'.
    """
    if digits < 1:
        raise ValueError(f"digits must be at least 1, not {digits}")
    if n is None:
        return "?"
    sign = "-" if n < 0 else ""
    value = abs(float(n))
    if round(value) < KIB:
        return f"{sign}{round(value):,} B"
    for unit in _BYTE_UNITS[1:-1]:
        value /= KIB
        text = _significant(value, digits)
        if float(text.replace(",", "")) < KIB:
            return f"{sign}{text} {unit}"
    return f"{sign}{_significant(value / KIB, digits)} {_BYTE_UNITS[-1]}"


def fmt_count(n: int | None) -> str:
    """A count as model names write one: 135M, 7.6B, 70B; "?" for none or zero (unknown)."""
    if not n:
        return "?"
    for scale, unit in _COUNT_UNITS:
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def fmt_rate(per_second: float, unit: str = "tok/s") -> str:
    """A rate with a decimal only where it matters, and where it fits (a GPU's prefill runs to
    five digits): fmt_rate(67.62) -> '67.6 tok/s'; fmt_rate(176.24) -> '176 tok/s'."""
    return f"{per_second:,.{1 if abs(per_second) < 100 else 0}f} {unit}"


def fmt_duration(seconds: float) -> str:
    """A wait in whole seconds, minutes or hours (an ETA): '45 s', '3 min 07 s', '1 h 05 min'."""
    s = max(0, int(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def fmt_latency(seconds: float) -> str:
    """A short measured time (time to first token): milliseconds below one second, else
    seconds with two decimals: fmt_latency(0.2134) -> '213 ms'; fmt_latency(12.3) -> '12.30 s'."""
    ms = round(seconds * 1000)
    return f"{ms} ms" if ms < 1000 else f"{seconds:,.2f} s"  # 0.9996 s is "1.00 s", not "1000 ms"


def _significant(value: float, digits: int) -> str:
    """`value` (>= 0) with `digits` significant digits, never fewer than its integer part."""
    for decimals in range(digits - 1, 0, -1):
        if round(value, decimals) < 10 ** (digits - decimals):
            return f"{value:,.{decimals}f}"
    return f"{value:,.0f}"
