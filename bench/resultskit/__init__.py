"""docs/results.md's machinery: the comparisons, their records, the statistics and the page rendered
from them. ``bench/results.py`` is its command line and says how the modules stack."""
