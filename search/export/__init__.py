"""Getting a run's factors out: the transformers/vLLM `rope_parameters` block, the LongRoPE release's CSV, and
`verify`, which checks that transformers and vLLM apply an exported block as the scorer did."""
