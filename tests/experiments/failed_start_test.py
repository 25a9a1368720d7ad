"""A failed start writes nothing: a malformed data file stops the MovieLens binary with a usage error naming the
file and line, before anything is written to --output_dir."""

import os

import pytest
from absl import app
from absl import flags

from experiments import movielens_mf as binary

FLAGS = flags.FLAGS
_GOOD = '1\t2\t3\t881250949\n2\t2\t4\t881250950\n'


def _run(argv):
    FLAGS.unparse_flags()
    FLAGS(['movielens_mf'] + argv)
    try:
        binary.main([])
    finally:
        FLAGS.unparse_flags()


@pytest.mark.parametrize(
    'u_data, line',
    [
        (_GOOD + '3\t2\n', 3),  # Truncated record.
        (_GOOD + '3\t2\t6\t881250951\n', 3),  # Rating out of range.
        (_GOOD + '3\t2\tfive\t881250951\n', 3),  # Wrongly typed field.
        (_GOOD + '9' * 30 + '\t2\t3\t881250951\n', 3),  # Id too large for int64.
        (_GOOD + '\n' + _GOOD, 3),  # Blank line inside the file.
        ('', 1),  # Empty file.
        (b'\x00\xff\xfe garbage', 1),  # Binary junk.
    ],
)
@pytest.mark.parametrize('output_exists', [False, True])
def test_malformed_u_data_stops_before_writing_the_output_dir(tmp_path, u_data, line, output_exists):
    data_dir = tmp_path / 'ml'
    data_dir.mkdir()
    (data_dir / 'u.data').write_bytes(u_data if isinstance(u_data, bytes) else u_data.encode())
    out = tmp_path / 'out'
    if output_exists:
        out.mkdir()
    with pytest.raises(app.UsageError, match=rf'u\.data line {line}\b'):
        _run(['--total_rounds=1', f'--data_dir={data_dir}', f'--output_dir={out}'])
    assert not out.exists() or os.listdir(out) == []
