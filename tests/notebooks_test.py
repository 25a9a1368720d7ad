"""The tutorial notebooks run top to bottom (nbclient, a fresh kernel each) and show their plots inline.

Each notebook asserts its own result in its last cells (e.g. FedRecon beats the mean rating on unseen users), so
a notebook whose method stopped working fails here, not only one that raises.
"""

from __future__ import annotations

import glob
import os

import nbclient
import nbformat
import pytest

_NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), '..', 'notebooks', '*.ipynb')))


def test_there_are_tutorials():
    assert len(_NOTEBOOKS) >= 1


@pytest.mark.parametrize('path', _NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_top_to_bottom_with_inline_plots(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get('outputs') for cell in notebook.cells if cell.cell_type == 'code'), (
        f'{path} is committed with outputs; clear them (the tests execute it).'
    )
    client = nbclient.NotebookClient(
        notebook, timeout=900, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}
    )
    client.execute()  # Raises CellExecutionError naming the cell on any error (failed asserts included).
    images = [
        output
        for cell in notebook.cells
        if cell.cell_type == 'code'
        for output in cell.outputs
        if 'image/png' in output.get('data', {})
    ]
    assert images, f'{path} shows no plot'
