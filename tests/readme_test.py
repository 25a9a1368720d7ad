"""README.md's Python example runs as written against the current API."""

import contextlib
import io
import os
import re

_README = os.path.join(os.path.dirname(__file__), '..', 'README.md')


def test_the_readme_python_example_runs():
    with open(_README) as f:
        blocks = re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)
    assert blocks, 'README.md has no python example'
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], 'README.md', 'exec'), {'__name__': 'readme'})  # pylint: disable=exec-used
    rmse, per_client = out.getvalue().split(' ', 1)
    assert 0.0 < float(rmse) < 1.0, out.getvalue()  # Ratings 1-5: untrained embeddings give RMSE > 3.
    assert 'p50' in per_client, per_client
