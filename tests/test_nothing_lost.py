"""Nothing lost on the way to and from disk: ``save`` / ``export_tcnn`` refuse what ``load`` / ``load_tcnn`` would
refuse and leave the old file; a Ctrl-C during ``save`` arrives as ``KeyboardInterrupt`` with the old file intact;
``load_tcnn`` of a missing file raises ``FileNotFoundError`` as ``load`` does."""
import gc
import sys
import zipfile

import numpy as np
import pytest

from interrupts import batch, model


def poisoned(m):
    """``m`` with one training weight NaN (what a diverging step leaves; ``set_params`` refuses NaN, so written
    into the store directly)."""
    store = m.trainer.master_store
    values = store.read(store.params, store.offset, m.network.n_params)
    values[0, 3] = np.nan
    store.write(store.params, store.offset, values)
    store.write(store.inference_params, store.offset, values)
    return m


def test_save_refuses_what_load_refuses_and_keeps_the_old_file(tmp_path):
    x, y = batch()
    m = model()
    m.trainer.training_step(x, y)
    path = tmp_path / "last.npz"
    m.trainer.save(path)
    old = path.read_bytes()
    poisoned(m)
    with pytest.raises(ValueError, match=r"last\.npz: cannot save the checkpoint: checkpoint array 'params' holds "
                                         r"non-finite values \(1 of"):
        m.trainer.save(path)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.npz"]
    model().trainer.load(path)                                      # still loads


def test_export_tcnn_refuses_what_load_tcnn_refuses_and_keeps_the_old_file(tmp_path):
    m = model()
    path = tmp_path / "last.json"
    m.trainer.export_tcnn(path)
    old = path.read_bytes()
    poisoned(m)
    with pytest.raises(ValueError, match=r"last\.json: cannot write the tcnn snapshot: it would hold 1 non-finite"):
        m.trainer.export_tcnn(path)
    assert path.read_bytes() == old
    model().trainer.load_tcnn(path)


def test_load_tcnn_of_a_missing_file_raises_file_not_found(tmp_path):
    m = model()
    for call in (m.trainer.load, m.trainer.load_tcnn):
        with pytest.raises(FileNotFoundError, match="not_yet"):
            call(tmp_path / "not_yet")


def test_ctrl_c_inside_savez_is_a_keyboard_interrupt_and_keeps_the_old_file(tmp_path, monkeypatch):
    """The interrupt lands in zipfile's closing of a member, inside numpy's ``savez``, whose cleanup turns it
    into zipfile's ValueError."""
    x, y = batch()
    m = model()
    m.trainer.training_step(x, y)
    path = tmp_path / "ck.npz"
    m.trainer.save(path)
    old = path.read_bytes()
    m.trainer.training_step(x, y)
    hits = []
    close = zipfile._ZipWriteFile.close

    def interrupted_close(self):
        hits.append(1)
        if len(hits) == 2:
            raise KeyboardInterrupt                 # as a Ctrl-C as the second member is being closed
        return close(self)

    monkeypatch.setattr(zipfile._ZipWriteFile, "close", interrupted_close)
    with pytest.raises(KeyboardInterrupt):
        m.trainer.save(path)
    monkeypatch.undo()
    # Nothing of the interrupted archive is left for a finaliser to report (zipfile's "Exception ignored ... seek of
    # closed file", printed by a later garbage collection: inside Python 3.11's ast conversion of a kernel being
    # compiled, the unraisable hook's ast.parse once failed the outer conversion with a SystemError).
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    gc.collect()
    monkeypatch.undo()
    assert unraisable == []
    assert len(hits) == 2
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz"]
