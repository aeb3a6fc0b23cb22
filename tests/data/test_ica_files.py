"""scenario=files for RF-ICA: one CSV, NPY or NPZ per site, rows = samples, columns = channels."""

import numpy as np
import pytest

from fedica.config import ConfigError, validate_config
from fedica.data.files import DataFileError, load_ica_file
from fedica.data.scenarios import ica_poor_sites, ica_scenario_data, ica_scenario_truth


def _files(tmp_path, n=300, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.laplace(size=(n, channels)) @ rng.standard_normal((channels, channels))
    csv = tmp_path / "a.csv"
    np.savetxt(csv, X, delimiter=",", header=",".join(f"c{i}" for i in range(channels)), comments="")
    npy, npz = tmp_path / "b.npy", tmp_path / "c.npz"
    np.save(npy, X[::-1].copy())
    np.savez(npz, X=X[: n // 2], y=np.zeros(n // 2, dtype=int))
    return X, [str(csv), str(npy), str(npz)]


def _scenario(paths, **keys):
    return {"name": "files", "paths": paths, "label_column": None, "n_components": None, "test_fraction": 0.3,
            "write_sources": False, **keys}


def test_reads_the_three_formats_as_observations(tmp_path):
    X, paths = _files(tmp_path)
    np.testing.assert_allclose(load_ica_file(paths[0]), X, rtol=1e-9)
    np.testing.assert_array_equal(load_ica_file(paths[1]), X[::-1])
    np.testing.assert_array_equal(load_ica_file(paths[2]), X[:150])  # the npz's y is ignored
    sc = _scenario(paths)
    Y = ica_scenario_data(sc, 1, seed=4)
    assert Y.shape == (3, 300)  # (channels, samples), RF-ICA's convention
    np.testing.assert_array_equal(Y, X[::-1].T)
    np.testing.assert_array_equal(ica_scenario_data(sc, 1, seed=5), Y)  # a file does not depend on the seed
    assert ica_scenario_truth(sc, 0) is None and ica_poor_sites(sc, 0) is None


def test_label_column_is_dropped_from_the_channels(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time,x,y\n" + "\n".join(f"{i},{np.sin(i)},{np.cos(3 * i)}" for i in range(20)) + "\n")
    X = load_ica_file(path, label_column="time")
    assert X.shape == (20, 2)
    assert ica_scenario_data(_scenario([str(path)], label_column=0), 0, 0).shape == (2, 20)


def test_an_edited_file_is_read_again(tmp_path):
    _, paths = _files(tmp_path)
    before = ica_scenario_data(_scenario(paths), 1, 0)
    np.save(paths[1], np.random.default_rng(1).normal(size=(50, 3)))
    after = ica_scenario_data(_scenario(paths), 1, 0)
    assert after.shape == (3, 50) and before.shape == (3, 300)


@pytest.mark.parametrize("content, message", [
    ("x\n1\n2\n3\n", "has 1 channel (column); ICA needs at least 2"),
    ("a,b,c\n1,2,3\n4,5,6\n", "has 2 samples (rows) for 3 channels; ICA needs more samples than channels"),
    ("a,b\n1,2\n3,oops\n4,5\n", "line 3, column 1: not a number"),
    ("a,b\n1,2\n3,nan\n4,5\n", "line 3, column 1: not finite"),
    ("a,b\n1,2\n3\n4,5\n", "line 3 has 1 cells, expected 2"),
    ("a,b\n1,2\n1,2\n1,2\n", "all its 3 samples are the same: every channel is constant"),
])
def test_bad_files_are_one_line_naming_the_file(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(DataFileError) as info:
        load_ica_file(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def _cfg(paths, *overrides):
    from fedica.server.app import compose_config

    return compose_config(["algorithm=rfica", "scenario=files", "engine=inprocess",
                           f"scenario.paths=[{','.join(paths)}]", *overrides])


def test_config_accepts_files_for_rfica_without_fedgem_keys(tmp_path):
    _, paths = _files(tmp_path)
    cfg = validate_config(_cfg(paths))
    assert cfg["scenario"]["n_components"] is None and cfg["scenario"]["write_sources"] is False
    validate_config(_cfg(paths, "scenario.write_sources=true"))


def test_config_refuses_other_channels_or_a_bad_file_in_one_line(tmp_path):
    _, paths = _files(tmp_path)
    other = tmp_path / "d.npy"
    np.save(other, np.random.default_rng(0).standard_normal((100, 4)))
    with pytest.raises(ConfigError) as info:
        validate_config(_cfg([*paths, str(other)]))
    assert str(info.value) == (f"scenario.paths[3]={other}: has 4 channels (columns) but scenario.paths[0] has 3; "
                               "every site must observe the same channels")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match=r"^scenario\.paths\[1\]=.*bad\.csv: has 1 samples \(rows\) for 2 channels"):
        validate_config(_cfg([paths[0], str(bad)]))
    with pytest.raises(ConfigError, match=r"^scenario\.paths\[1\]=.*: no such file$"):
        validate_config(_cfg([paths[0], str(tmp_path / "missing.csv")]))


def test_config_write_sources_rules(tmp_path):
    from fedica.server.app import compose_config

    _, paths = _files(tmp_path)
    with pytest.raises(ConfigError, match=r"^scenario\.write_sources=true: sources are written only by engines"):
        validate_config(_cfg(paths, "engine=deployment", "scenario.write_sources=true"))
    with pytest.raises(ConfigError, match=r"^scenario\.write_sources=True: only RF-ICA recovers sources"):
        validate_config(compose_config(["algorithm=fedgem", "scenario=files", f"scenario.paths=[{paths[0]}]",
                                        "scenario.n_components=2", "scenario.write_sources=true"]))
    with pytest.raises(ConfigError, match=r"^scenario\.write_sources='yes': must be true or false"):
        validate_config(_cfg(paths, "scenario.write_sources=yes"))
