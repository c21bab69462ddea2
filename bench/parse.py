"""Turn parser time against input size, on adversarial tag soup.

A response holds up to thousands of tokens of anything, and the parser reads every turn of every
rollout and evaluation episode. This prints, per input size, the time of ``parse_turn`` (plus
``final_answer``) on three kinds of soup, and beside it the time of the lazy-regex scan the
parser used before (``<tool_call>(.*?)</tool_call>`` with ``findall``), which is quadratic on
unclosed calls; the old scan is only run up to the size where it stays under a few seconds.

    python bench/parse.py [--max-chars 1000000]

Linear time shows as a constant time per character across sizes.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from records import write_record  # bench/records.py (the script's own directory is on sys.path)

from spader.core.parsing import final_answer, parse_turn

_OLD_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

SOUPS = {
    "unclosed <tool_call>": lambda n: "<tool_call>" * (n // 11),
    "nested/unbalanced <think>": lambda n: ("<think>" * 3 + "</think>" + "<answer>[") * (n // 38),
    "calls never closed, think inside": lambda n: ('<tool_call>["a"<think>') * (n // 22),
}


def best_of(fn, text: str, repeats: int = 3) -> float:
    """Fastest of ``repeats`` runs, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - start)
    return min(times)


def parse_now(text: str) -> None:
    parse_turn(text)
    final_answer(text)


def parse_before(text: str) -> None:
    _OLD_TOOL_CALL.findall(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-chars", type=int, default=1_000_000)
    ap.add_argument("--records", default=None, help="where the record goes (default: bench/records)")
    args = ap.parse_args()
    sizes = [s for s in (1_000, 10_000, 100_000, 1_000_000, 10_000_000) if s <= args.max_chars]
    old_limit = 40_000  # the old scan takes ~10 s at 16,000 repeats of an unclosed call
    print(f"{'soup':34} {'chars':>10} {'parser ms':>10} {'ns/char':>8} {'old regex ms':>13} {'old/new':>8}")
    per_char, at_largest, ratios = [], [], []
    for name, make in SOUPS.items():
        for size in sizes:
            text = make(size)
            new = best_of(parse_now, text)
            old = best_of(parse_before, text, repeats=1) if len(text) <= old_limit else None
            old_ms = f"{1e3 * old:13.1f}" if old is not None else f"{'(skipped)':>13}"
            ratio = f"{old / new:8.0f}" if old is not None else f"{'':>8}"
            print(
                f"{name:34} {len(text):>10,} {1e3 * new:10.2f} {1e9 * new / len(text):8.1f} {old_ms} {ratio}"
            )
            per_char.append(1e9 * new / len(text))
            if size == sizes[-1]:
                at_largest.append(1e3 * new)
            if old is not None and size == 10_000:
                ratios.append(old / new)
    linear = max(per_char) < 50  # ns per character at every size: no quadratic blow-up
    path = write_record(
        "bench/parse.py",
        [
            {
                "what": "turn parser on adversarial tag soup (unclosed `<tool_call>`, nested/unbalanced `<think>`)",
                "result": f"{sizes[-1]:,} chars in {min(at_largest):.1f}-{max(at_largest):.1f} ms "
                f"({min(per_char):.0f}-{max(per_char):.0f} ns/char at every size); the previous lazy regex "
                f"{max(ratios):,.0f}x slower at 10,000 chars"
                if ratios
                else "",
                "target": "linear time",
                "verdict": "met" if linear else "not met",
                "numbers": {"ns_per_char_max": round(max(per_char), 2), "ms_at_largest": at_largest},
            }
        ],
        argv=sys.argv[1:],
        directory=args.records,
    )
    print(f"record: {path}")


if __name__ == "__main__":
    main()
