"""What a person runs end to end: the demo, qualify, the benchmarks' chains. The top
layer: it submits through chain/, reads through observe/, judges through image/, and
nothing below imports it."""
