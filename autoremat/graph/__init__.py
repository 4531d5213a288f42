"""Stage 1: trace a function to a dataflow graph with memory, FLOP and time costs."""
