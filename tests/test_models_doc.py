"""docs/models.md's table of assets agrees with the tree: every registered adapter, HMM and prior
head has one row naming its folder; a shipped asset's size is its folder's; every folder of
ctrlg/assets is registered; and every asset a pipeline uses by default is in the shipped table
and in the tree (each asset kept is used by a default or a documented pipeline, the rest are
re-created by their commands)."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ctrlg.app.__main__ import DEFAULT_ADAPTER as APP_ADAPTER, DEFAULT_HMM as APP_HMM
from ctrlg.hmm import EMBEDDED_HMMS, EMBEDDED_PRIOR_HEADS
from ctrlg.lm.adapters import EMBEDDED_ADAPTERS

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "ctrlg" / "assets"
CONFIGS = ROOT / "configs"
ROW = re.compile(r"^\| (adapter|HMM|prior head) `([^`]+)`[^|]* \| `([^`]+)` \| ([^|]+) \|", re.M)
KIND = {"adapter": EMBEDDED_ADAPTERS, "HMM": EMBEDDED_HMMS, "prior head": EMBEDDED_PRIOR_HEADS}


def _tables() -> tuple[dict, dict]:
    """``({(kind, name): (folder, size cell)}`` of the shipped table, the same of the
    not-shipped one)."""
    text = (ROOT / "docs" / "models.md").read_text()
    shipped, _, not_shipped = text.partition("### Not shipped")
    rows = lambda part: {(k, n): (f, s.strip()) for k, n, f, s in ROW.findall(part)}  # noqa: E731
    return rows(shipped), rows(not_shipped)


def _megabytes(folder: Path) -> str:
    return f"{sum(p.stat().st_size for p in folder.rglob('*') if p.is_file()) / 1e6:.1f} MB"


def _default_assets() -> set[tuple[str, str]]:
    """(kind, name) of every asset a pipeline, task or the editor uses by default."""
    used = {("HMM", APP_HMM), ("adapter", APP_ADAPTER)}

    def add_model(name):
        adapter = OmegaConf.load(CONFIGS / "model" / f"{name}.yaml").get("adapter")
        if adapter:
            used.add(("adapter", adapter))

    def add_hmm(name):
        cfg = OmegaConf.load(CONFIGS / "hmm" / f"{name}.yaml")
        used.add(("HMM", cfg.name or "instruct"))
        if cfg.get("prior_head"):
            used.add(("prior head", cfg.prior_head))

    roots = [CONFIGS / "pipeline" / f.name for f in (CONFIGS / "pipeline").glob("*.yaml")]
    roots += [CONFIGS / "infill.yaml", CONFIGS / "edit.yaml", CONFIGS / "commongen.yaml"]
    for path in roots:
        for item in OmegaConf.load(path).get("defaults", []):
            if not isinstance(item, dict) and not OmegaConf.is_dict(item):
                continue
            for key, value in dict(item).items():
                group = key.split("@")[0].replace("override /", "").strip()
                if group == "model":
                    add_model(value)
                elif group == "hmm":
                    add_hmm(value)
    return used


def test_every_registered_asset_has_one_row_naming_its_folder():
    shipped, not_shipped = _tables()
    for kind, registry in KIND.items():
        for name, folder in registry.items():
            rows = [table[(kind, name)] for table in (shipped, not_shipped) if (kind, name) in table]
            assert len(rows) == 1, f"docs/models.md lists {kind} {name!r} {len(rows)} times"
            assert rows[0][0] == folder, (kind, name, rows[0][0], folder)
    listed = set(shipped) | set(not_shipped)
    registered = {(k, n) for k, reg in KIND.items() for n in reg}
    assert listed <= registered, f"docs/models.md lists unregistered assets {listed - registered}"


def test_every_folder_under_assets_is_registered():
    registered = {f for registry in KIND.values() for f in registry.values()}
    folders = {p.name for p in ASSETS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= registered, f"unregistered folders in ctrlg/assets: {folders - registered}"


def test_the_sizes_on_the_page_are_the_folders():
    shipped, _ = _tables()
    for (kind, name), (folder, size) in shipped.items():
        path = ASSETS / folder
        if path.is_dir():
            assert size == _megabytes(path), f"{kind} {name}: docs/models.md says {size}, the folder holds {_megabytes(path)}"
        else:
            assert size == "not in the tree yet", f"{kind} {name}: {folder} is absent, the page says {size}"


@pytest.mark.parametrize("asset", sorted(_default_assets()), ids=lambda a: f"{a[0]} {a[1]}")
def test_every_asset_used_by_a_default_ships(asset):
    kind, name = asset
    shipped, not_shipped = _tables()
    assert asset in shipped and asset not in not_shipped, f"{kind} {name} is used by a default"
    assert (ASSETS / KIND[kind][name]).is_dir(), (
        f"{kind} {name}, used by a default, is not in ctrlg/assets/{KIND[kind][name]}")


def test_nothing_outside_the_defaults_ships():
    shipped, _ = _tables()
    used = _default_assets()
    for asset, (folder, _) in shipped.items():
        if (ASSETS / folder).is_dir():
            assert asset in used, f"{asset} ships but no default uses it: move it to 'Not shipped'"
