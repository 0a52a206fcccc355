"""`streammargin evaluate`'s library: prequential evaluation of models on streams.

`records.py`: a record's checks and the bad record it is otherwise; `readers.py`: the files read
as rows; `sources.py`: the streams and their survey; `runner.py`: the test-then-train loop.
"""
