"""What a window's loss can measure, by name (`data.objective`), apart from the window code so that the config
can be checked without importing numpy (`longrope --help` and `validate` stay fast).

perplexity: every next-token prediction of the window; tail: only positions past the original length (where
extrapolation is tested); needle: only the answer tokens of a hidden number retrieved at the window's end
(LongRoPE2's needle-driven perplexity, arXiv 2502.20082).
"""

OBJECTIVES = ("perplexity", "tail", "needle")
