"""A user's files give the answer their data holds, or say why not (issue 44, item 4: no silent wrong answer)."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from fedica.data.files import DataFileError, read_table


def _sites(folder, rng, flip=0.0, n_sites=3, n_rows=80):
    """CSV files of two well-separated groups, with a label column naming each row's group (``flip`` of them wrong)."""
    paths, labels = [], []
    for site in range(n_sites):
        group = np.arange(n_rows) % 2
        label = np.where(rng.random(n_rows) < flip, 1 - group, group)
        points = rng.standard_normal((n_rows, 2)) + 10 * group[:, None]
        paths.append(folder / f"site{site}.csv")
        with open(paths[-1], "w") as handle:
            handle.write("a,b,label\n")
            handle.writelines(f"{x:.6f},{y:.6f},{c}\n" for (x, y), c in zip(points, label))
        labels.append((group, label))
    return paths, labels


def test_a_run_without_a_held_out_share_scores_its_training_rows_and_says_so(tmp_path):
    # Before: scenario.test_fraction=0 with a label column printed k_hat 0 and ARIs of 1.0 (an empty test set),
    # where the labels' ARI was .28.
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    paths, labels = _sites(tmp_path, np.random.default_rng(0), flip=0.2)
    result = run_inprocess(compose_config([
        "engine=inprocess", "algorithm=fedgem", "scenario=files", f"scenario.paths=[{','.join(map(str, paths))}]",
        "scenario.label_column=label", "scenario.test_fraction=0", "scenario.n_components=2", "baselines=false"]))
    metrics = result["metrics"]["fedgem"]
    # The clusters are the groups exactly, so the ARI is that of the labels against the groups.
    truth = adjusted_rand_score(np.concatenate([label for _, label in labels]), np.concatenate([g for g, _ in labels]))
    assert metrics["k_hat"] == 2
    assert metrics["global_ari"] == pytest.approx(truth, abs=1e-12) and truth < 0.5
    assert any("the ARIs score the training rows" in warning for warning in result["warnings"])


def test_a_pandas_index_or_r_row_names_is_refused_in_one_line(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"a": np.arange(40) % 2 * 5.0 + 0.1, "b": np.linspace(0, 1, 40)})
    for name, write in [("pandas.csv", lambda path: frame.to_csv(path)),
                        ("r.csv", lambda path: path.write_text('"","a","b"\n' + "".join(
                            f'"{i + 1}",{a},{b}\n' for i, (a, b) in enumerate(frame.to_numpy()))))]:
        write(tmp_path / name)
        with pytest.raises(DataFileError, match="its first column has no name and holds the row numbers") as err:
            read_table(tmp_path / name)
        assert "\n" not in str(err.value) and "index=False" in str(err.value)
    frame.to_csv(tmp_path / "clean.csv", index=False)
    assert read_table(tmp_path / "clean.csv")[0].shape == (40, 2)


def test_a_label_column_left_among_the_features_is_a_warning_naming_it(tmp_path):
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    paths, _ = _sites(tmp_path, np.random.default_rng(1))
    run = ["engine=inprocess", "algorithm=fedgem", "scenario=files", f"scenario.paths=[{','.join(map(str, paths))}]",
           "scenario.n_components=2", "baselines=false", "algorithm.rounds=2"]
    (warning,) = [w for w in run_inprocess(compose_config(run))["warnings"] if "distinct whole numbers" in w]
    assert f"{paths[0]}'s column 'label' holds only 2 distinct whole numbers" in warning
    assert "give scenario.label_column='label'" in warning
    told = run_inprocess(compose_config([*run, "scenario.label_column=label"]))
    assert not [w for w in told["warnings"] if "distinct whole numbers" in w]


def test_both_central_gmms_run_on_files_when_asked_for(tmp_path):
    # Before: 'baseline_methods=[central-gmm,central-gmm-icl]' on files ran no comparator, with one INFO line.
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    paths, _ = _sites(tmp_path, np.random.default_rng(2))
    result = run_inprocess(compose_config([
        "engine=inprocess", "algorithm=fedgem", "scenario=files", f"scenario.paths=[{','.join(map(str, paths))}]",
        "scenario.label_column=label", "scenario.n_components=2", "baselines=true",
        "baseline_methods=[central-gmm,central-gmm-icl]"]))
    metrics = result["metrics"]
    assert metrics["central-gmm"]["k_true"] == 2 and metrics["central-gmm"]["global_ari"] > 0.99
    assert metrics["central-gmm-icl"]["k_chosen"] == 2 and metrics["central-gmm-icl"]["global_ari"] > 0.99


def test_a_file_missing_a_column_is_refused_before_the_run(tmp_path):
    # Before: the site was left out at initialisation ('centroids' has dimension 2; the federation's data has d=3)
    # and the run ended with exit 0.
    from fedica.config import ConfigError, validate_config
    from fedica.server.app import compose_config

    paths, _ = _sites(tmp_path, np.random.default_rng(3))
    rows = paths[1].read_text().splitlines()
    paths[1].write_text("\n".join(",".join(row.split(",")[1:]) for row in rows) + "\n")  # column a dropped
    with pytest.raises(ConfigError) as err:
        validate_config(compose_config(["engine=inprocess", "algorithm=fedgem", "scenario=files", "scenario.n_components=2",
                                        f"scenario.paths=[{','.join(map(str, paths))}]", "scenario.label_column=label"]))
    assert err.value.errors == [f"scenario.paths[1]={paths[1]}: 1 feature columns, where 2 of the 3 files have 2 (a "
                                "column missing or added?); every site's file must have the same columns in the same order"]
