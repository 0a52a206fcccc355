"""`streammargin evaluate`'s library: prequential evaluation of models on streams.

`records.py`: a record's checks and the bad record it is otherwise; `readers.py`: CSV, JSON
lines and libsvm files (gzip too) read as rows, every line bounded; `arff.py`: ARFF files;
`sources.py`: the streams and their survey; `runner.py`: every model in one pass, labels at once
or late; `metrics.py`: MOA's measures, cumulative, per window and faded; `results.py`: the
results file, the plot, mean ranks.
"""
