"""`compare` and `extrapolation`: rerunning methods on the test split and turning the scores into tables,
intervals and plots (matplotlib is imported only when a plot is drawn)."""
