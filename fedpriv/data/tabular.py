"""Tabular loaders: UCI Adult and ACSIncome (one natural client per US state).

Both encodings are fixed public functions of a row: numeric columns are standardized with the
constants stated below (measured once on the files named there) and categorical columns are
one-hot over the code lists of the datasets' documentation (adult.names, the ACS PUMS 2018 data
dictionary), so the transform never depends on which rows are loaded. Unknown or missing codes
('?' in Adult) become an all-zero block.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedpriv.common.errors import ConfigError, check
from fedpriv.data.arrays import ArrayDataset
from fedpriv.data.files import check_rows, reading

# ----------------------------------------------------------------------------- UCI Adult
ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week",
    "native-country", "income",
)  # fmt: skip
# (column, transform, mean, std) of the transformed value over the 32,561 rows of adult.data.
ADULT_NUMERIC: tuple[tuple[str, str, float, float], ...] = (
    ("age", "identity", 38.5816, 13.6402),
    ("fnlwgt", "identity", 189778.4, 105548.4),
    ("education-num", "identity", 10.0807, 2.5727),
    ("capital-gain", "log1p", 0.7346, 2.4547),
    ("capital-loss", "log1p", 0.3503, 1.5846),
    ("hours-per-week", "identity", 40.4375, 12.3472),
)
# Category lists as in adult.names.
ADULT_CATEGORIES: dict[str, tuple[str, ...]] = {
    "workclass": (
        "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
        "Without-pay", "Never-worked",
    ),
    "education": (
        "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc",
        "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool",
    ),
    "marital-status": (
        "Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
        "Married-spouse-absent", "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
        "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
        "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv", "Armed-Forces",
    ),
    "relationship": (
        "Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried",
    ),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
        "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba", "Iran",
        "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal",
        "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
        "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
        "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands",
    ),
}  # fmt: skip
ADULT_PROVENANCE = (
    "UCI Adult (Census Income), Kohavi & Becker 1996, license CC BY 4.0; adult.data (train) and "
    "adult.test (test), label income >50K."
)

# ----------------------------------------------------------------------------- ACSIncome
ACS_COLUMNS = ("AGEP", "COW", "SCHL", "MAR", "OCCP", "POBP", "RELP", "WKHP", "SEX", "RAC1P")
ACS_LABEL = "PINCP"
# mean / std over all 1,130,719 rows of the 47 FeDa4Fair 2018 state files.
ACS_NUMERIC: tuple[tuple[str, float, float], ...] = (("AGEP", 43.45, 15.40), ("WKHP", 38.31, 13.12))
# Codes one-hot encoded as such (ACS PUMS 2018 data dictionary ranges).
ACS_CODES: dict[str, tuple[int, ...]] = {
    "COW": tuple(range(1, 10)),
    "SCHL": tuple(range(1, 25)),
    "MAR": tuple(range(1, 6)),
    "RELP": tuple(range(0, 18)),
    "SEX": (1, 2),
    "RAC1P": tuple(range(1, 10)),
}
# OCCP 2018 codes -> occupation major group (MGR, BUS, FIN, CMM, ENG, SCI, CMS, LGL, EDU, ENT, MED,
# HLS, PRT, EAT, CLN, PRS, SAL, OFF, FFF, CON, EXT, RPR, PRD, TRN, MIL, unemployed): lower bounds.
OCCP_GROUP_STARTS = (
    10, 500, 800, 1005, 1305, 1600, 2001, 2100, 2205, 2600, 3000, 3601, 3700, 4000, 4200, 4330,
    4700, 5000, 6005, 6200, 6800, 7000, 7700, 9005, 9800, 9920,
)  # fmt: skip
# POBP place of birth -> region: US state, US island area, Europe, Asia, Americas, Africa, Oceania.
POBP_GROUP_STARTS = (1, 60, 100, 158, 300, 400, 500)
ACS_PROVENANCE = (
    "ACSIncome 2018 (US Census Bureau ACS PUMS, public domain; Ding et al. 2021 'Retiring Adult'), "
    "one file per state as published by FeDa4Fair (MAR and RAC1P remapped; 12 states with rows "
    "dropped by the source). Label PINCP > 50,000."
)


def one_hot(codes: np.ndarray, categories: Sequence[int] | np.ndarray) -> np.ndarray:
    """One-hot encode integer ``codes`` (N,) over ``categories`` (K,) -> float32 (N, K);
    codes outside ``categories`` give an all-zero row."""
    cats = np.asarray(categories)
    pos = np.searchsorted(cats, codes)
    pos_c = np.minimum(pos, len(cats) - 1)
    hit = cats[pos_c] == codes
    out = np.zeros((len(codes), len(cats)), dtype=np.float32)
    out[np.flatnonzero(hit), pos_c[hit]] = 1.0
    return out


def _bucket(codes: np.ndarray, starts: Sequence[int]) -> np.ndarray:
    """Index of the half-open range ``[starts[i], starts[i+1])`` holding each code, -1 below."""
    return np.searchsorted(np.asarray(starts), codes, side="right") - 1


def _require_file(path: Path, expected: str) -> Path:
    if not path.is_file():
        raise ConfigError("dataset.data_dir", str(path.parent), f"lacks {path.name}; {expected}")
    return path


# ----------------------------------------------------------------------------- Adult
#: Rows of the published UCI files (Kohavi 1996; adult.names: 32561 train, 16281 test).
ADULT_ROWS = {"adult.data": 32561, "adult.test": 16281}


def _read_adult_rows(path: Path) -> list[list[str]]:
    """Rows of 15 fields; skips blank lines and adult.test's '|1x3 Cross validator' header.

    Raises
    ------
    ConfigError
        If the file cannot be read, or holds another number of rows than the published file
        (:data:`ADULT_ROWS`: a truncated download is refused, naming the file).
    """
    with reading(path), open(path, newline="") as fh:
        reader = csv.reader(fh, skipinitialspace=True)
        rows = [row for row in reader if len(row) == len(ADULT_COLUMNS)]
    if path.name in ADULT_ROWS:
        check_rows(path, len(rows), ADULT_ROWS[path.name])
    return rows


def encode_adult(rows: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Encode Adult rows to features float32 (N, 105) and labels int64 (N,) (1 = income >50K).

    The test file's labels end with '.', which is stripped; '?' fields one-hot to zeros.

    Raises
    ------
    ConfigError
        If a label is neither '<=50K' nor '>50K' (with or without the trailing '.').
    """
    col = {name: i for i, name in enumerate(ADULT_COLUMNS)}
    blocks = []
    for name, transform, mean, std in ADULT_NUMERIC:
        values = np.array([float(r[col[name]]) for r in rows], dtype=np.float64)
        if transform == "log1p":
            values = np.log1p(values)
        blocks.append(((values - mean) / std).astype(np.float32)[:, None])
    for name, cats in ADULT_CATEGORIES.items():
        index = {c: k for k, c in enumerate(cats)}
        codes = np.array([index.get(r[col[name]], -1) for r in rows], dtype=np.int64)
        blocks.append(one_hot(codes, np.arange(len(cats))))
    labels = [r[col["income"]].rstrip(".") for r in rows]
    bad = sorted(set(labels) - {"<=50K", ">50K"})
    if bad:
        raise ConfigError("adult.income", bad[0], "must be '<=50K' or '>50K' (optionally with '.')")
    y = np.array([lab == ">50K" for lab in labels], dtype=np.int64)
    return np.concatenate(blocks, axis=1), y


def adult_feature_names() -> tuple[str, ...]:
    """Names of the 105 Adult feature columns, in order."""
    names = [name for name, *_ in ADULT_NUMERIC]
    for name, cats in ADULT_CATEGORIES.items():
        names += [f"{name}={c}" for c in cats]
    return tuple(names)


def load_adult(data_dir: str | Path | None) -> ArrayDataset:
    """UCI Adult: 32,561 training rows (adult.data) and 16,281 test rows (adult.test).

    Features (105): 6 numeric columns standardized with :data:`ADULT_NUMERIC` (capital gain and
    loss after ``log1p``) and 8 categorical columns one-hot over the lists of adult.names.

    Raises
    ------
    ConfigError
        If ``data_dir`` is missing or lacks adult.data / adult.test.
    """
    expected = "expected adult.data and adult.test of UCI Adult (Census Income)"
    if data_dir is None:
        raise ConfigError("dataset.data_dir", None, f"must name a directory; {expected}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ConfigError("dataset.data_dir", str(path), f"is not a directory; {expected}")
    x_train, y_train = encode_adult(_read_adult_rows(_require_file(path / "adult.data", expected)))
    x_test, y_test = encode_adult(_read_adult_rows(_require_file(path / "adult.test", expected)))
    return ArrayDataset(
        name="adult",
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=2,
        input_shape=(x_train.shape[1],),
        provenance=ADULT_PROVENANCE,
        feature_names=adult_feature_names(),
    )


# ----------------------------------------------------------------------------- ACSIncome
def read_acs_state(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one state's ``.csv.gz``: raw feature codes float64 (n, 10) in :data:`ACS_COLUMNS`
    order and labels int64 (n,) from the boolean (or 0/1) ``PINCP`` column.

    Extra columns (e.g. ``__index_level_0__``) are ignored.

    Raises
    ------
    ConfigError
        If a needed column is missing or a value is not numeric.
    """
    with reading(path), gzip.open(path, "rb") as fh:
        raw = fh.read()
    header, _, body = raw.partition(b"\n")
    names = [h.strip() for h in header.decode().split(",")]
    missing = [c for c in (*ACS_COLUMNS, ACS_LABEL) if c not in names]
    if missing:
        raise ConfigError("acs_income file", str(path), f"lacks columns {missing}")
    wanted = [names.index(c) for c in (*ACS_COLUMNS, ACS_LABEL)]
    body = body.replace(b"True", b"1").replace(b"False", b"0")
    try:
        table = np.loadtxt(
            io.BytesIO(body), delimiter=",", usecols=wanted, dtype=np.float64, ndmin=2
        )
    except ValueError as err:
        raise ConfigError("acs_income file", str(path), f"is not numeric CSV: {err}") from err
    return table[:, :-1], (table[:, -1] > 0.5).astype(np.int64)


def encode_acs(raw: np.ndarray) -> np.ndarray:
    """Encode raw ACSIncome codes (n, 10) to features float32 (n, 102).

    AGEP and WKHP standardized with :data:`ACS_NUMERIC`; COW, SCHL, MAR, RELP, SEX, RAC1P one-hot
    over :data:`ACS_CODES`; OCCP one-hot over its 26 major groups; POBP over 7 regions.
    """
    col = {name: i for i, name in enumerate(ACS_COLUMNS)}
    blocks = [
        ((raw[:, col[name]] - mean) / std).astype(np.float32)[:, None]
        for name, mean, std in ACS_NUMERIC
    ]
    for name, codes in ACS_CODES.items():
        blocks.append(one_hot(raw[:, col[name]].astype(np.int64), codes))
    occp = _bucket(raw[:, col["OCCP"]], OCCP_GROUP_STARTS)
    blocks.append(one_hot(occp, np.arange(len(OCCP_GROUP_STARTS))))
    pobp = _bucket(raw[:, col["POBP"]], POBP_GROUP_STARTS)
    blocks.append(one_hot(pobp, np.arange(len(POBP_GROUP_STARTS))))
    return np.concatenate(blocks, axis=1)


def acs_feature_names() -> tuple[str, ...]:
    """Names of the 102 ACSIncome feature columns, in order."""
    names = [name for name, *_ in ACS_NUMERIC]
    for name, codes in ACS_CODES.items():
        names += [f"{name}={c}" for c in codes]
    names += [f"OCCP>={c}" for c in OCCP_GROUP_STARTS]
    names += [f"POBP>={c}" for c in POBP_GROUP_STARTS]
    return tuple(names)


def holdout_mask(num_rows: int, test_fraction: float, seed: int, key: str) -> np.ndarray:
    """Boolean (num_rows,) marking ``round(test_fraction * num_rows)`` test rows, drawn with a
    generator seeded by ``(seed, crc32(key))`` so each state's split is reproducible and
    independent of which other states are loaded."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(zlib.crc32(key.encode()),)))
    mask = np.zeros(num_rows, dtype=bool)
    mask[rng.permutation(num_rows)[: int(round(test_fraction * num_rows))]] = True
    return mask


def acs_state_files(data_dir: str | Path | None) -> dict[str, Path]:
    """Map state code -> file for every ``<ST>_*.csv.gz`` in ``data_dir`` (sorted by code).

    Raises
    ------
    ConfigError
        If the directory is missing or holds no such file.
    """
    expected = "expected one ACSIncome file per state named <ST>_*.csv.gz (e.g. AL_0.csv.gz)"
    if data_dir is None:
        raise ConfigError("dataset.data_dir", None, f"must name a directory; {expected}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ConfigError("dataset.data_dir", str(path), f"is not a directory; {expected}")
    files = {f.name.split("_")[0]: f for f in sorted(path.glob("*_*.csv.gz"))}
    if not files:
        raise ConfigError("dataset.data_dir", str(path), f"holds no *.csv.gz; {expected}")
    return dict(sorted(files.items()))


def load_acs_income(
    data_dir: str | Path | None,
    test_fraction: float = 0.2,
    seed: int = 0,
    states: Sequence[str] | None = None,
) -> ArrayDataset:
    """ACSIncome, one natural client per state: ``groups_train[i]`` indexes ``group_names``.

    Parameters
    ----------
    data_dir : str or Path
        Directory of per-state ``<ST>_*.csv.gz`` files (FeDa4Fair layout; see PROVENANCE.txt there
        or in its parent for the recoded columns and the states with dropped rows).
    test_fraction : float
        Share of each state's rows held out for test, in (0, 1).
    seed : int
        Seed of the per-state holdout (:func:`holdout_mask`).
    states : sequence of str or None
        Load only these state codes (default: every file).

    Raises
    ------
    ConfigError
        If the directory or files are missing, a requested state is absent, or ``test_fraction``
        is outside (0, 1).
    """
    check(0.0 < test_fraction < 1.0, "dataset.test_fraction", test_fraction, "must be in (0, 1)")
    files = acs_state_files(data_dir)
    if states is not None:
        unknown = sorted(set(states) - set(files))
        check(not unknown, "dataset.states", unknown, f"must be among {sorted(files)}")
        files = {st: files[st] for st in sorted(set(states))}
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("xtr", "ytr", "gtr", "xte", "yte", "gte")}
    for gid, (state, path) in enumerate(files.items()):
        raw, y = read_acs_state(path)
        x = encode_acs(raw)
        test = holdout_mask(len(y), test_fraction, seed, state)
        for tag, mask in (("tr", ~test), ("te", test)):
            parts["x" + tag].append(x[mask])
            parts["y" + tag].append(y[mask])
            parts["g" + tag].append(np.full(int(mask.sum()), gid, dtype=np.int64))
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return ArrayDataset(
        name="acs_income",
        x_train=cat["xtr"],
        y_train=cat["ytr"],
        x_test=cat["xte"],
        y_test=cat["yte"],
        num_classes=2,
        input_shape=(cat["xtr"].shape[1],),
        groups_train=cat["gtr"],
        provenance=ACS_PROVENANCE + _provenance_note(Path(data_dir)),  # type: ignore[arg-type]
        groups_test=cat["gte"],
        group_names=tuple(files),
        feature_names=acs_feature_names(),
    )


def _provenance_note(data_dir: Path) -> str:
    for candidate in (data_dir / "PROVENANCE.txt", data_dir.parent / "PROVENANCE.txt"):
        if candidate.is_file():
            return f" Details: {candidate}."
    return ""
