"""The README's real-scale table, from results/realscale.md (or sharded.md): one row per
hand-written plan that autoremat was given the peak of, hand-written against autoremat (and,
for the scans, each budget between two policies' peaks against the best hand-written plan within it).

    .venv/bin/python benchmarks/readme_table.py                          # results/realscale.md
    .venv/bin/python benchmarks/readme_table.py benchmarks/results/sharded.md

Prints markdown; JAX's policy names are shortened (`nothing`, `dots_no_batch`, `dots`); the
scan models' `prevent_cse=False` rows are left out (the same peaks and plans as with JAX's
default barriers in every run so far: the results file has them).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def sections(path: str) -> dict[str, tuple[dict, list]]:
    """section title -> ({hand-written plan: (GiB, +TFLOP matmul)}, [autoremat rows' cells])."""
    out: dict[str, tuple[dict, list]] = {}
    title = None
    for line in open(path):
        if line.startswith("### "):
            title = line[4:].strip()
            out[title] = ({}, [])
        elif title and line.startswith("| ") and not line.startswith("| plan"):
            c = _cells(line)
            if c[0].startswith("autoremat at "):
                out[title][1].append(c)
            elif c[-2] == "hand-written":
                out[title][0][c[0]] = (c[2], c[3])
    return out


SHORT = {"dots_with_no_batch_dims_saveable": "dots_no_batch", "nothing_saveable": "nothing",
         "dots_saveable": "dots"}  # JAX's policy names, shortened for the table (the legend says so)


def _short(label: str) -> str:
    for name, short in SHORT.items():
        label = label.replace(name, short)
    return label.replace("mix: ", "")


def table(path: str) -> list[str]:
    lines = ["| model | hand-written per layer | hand GiB / +TFLOP | autoremat GiB / +TFLOP / planning s (compiles) "
             "| expected GiB (error) |", "|---|---|---|---|---|"]
    for title, (hand, rows) in sections(path).items():
        for c in rows:
            label = c[0][len("autoremat at "):]
            if label.endswith("prevent_cse=False"):
                continue
            shown = _short(label)
            if label in hand:
                gib, tflop = hand[label]
            else:  # a budget between two policies (realscale.between_budgets): the best hand plan within it
                tflop, gib, best = min((float(t), g, lab) for lab, (g, t) in hand.items() if float(g) <= float(c[1]))
                tflop, shown = f"{tflop:.3f}", f"{shown} (hand: {_short(best)})"
            lines.append(f"| {title} | {shown} | {gib} / {tflop} | {c[2]} / {c[3]} / {c[5]} ({c[6]}) | {c[8]} |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print("\n".join(table(argv[0] if argv else os.path.join(HERE, "results", "realscale.md"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
