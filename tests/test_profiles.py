"""The shipped hardware profiles load and carry the published numbers; a broken profile is refused
with a message that names its file and the offending field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from export.profiles import OP_KINDS, PROFILE_DIR, ProfileError, list_profiles, load_profile

SHIPPED = ["cmos45nm", "jetson_orin_nano", "loihi", "truenorth"]

GOOD = """\
name = "bad"
description = "a small valid profile that each case below breaks in one place"
default_precision = "fp32"

[ops.fp32.mac]
pj = 4.6
basis = "published"
source = "a test"

[ops.fp32.neuron_update]
pj = 5.5
basis = "derived"
source = "a test"
note = "3.7 + 0.9 + 0.9"
"""


def write(tmp_path, text: str):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", list_profiles())
def test_every_shipped_profile_validates(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.default_precision in profile.precisions
    for precision in profile.precisions:
        costs = [profile.cost(op, precision) for op in OP_KINDS]
        assert any(costs)
        for cost in filter(None, costs):
            assert cost.pj > 0 and cost.source.strip()


def test_the_four_targets_ship():
    assert set(SHIPPED) <= set(list_profiles())


def test_cmos45nm_is_the_papers_energy_model():
    cmos = load_profile("cmos45nm")
    assert cmos.precisions == ["fp16", "fp32", "int8"]
    assert cmos.cost("mac").pj == pytest.approx(4.6)  # default precision fp32
    assert cmos.cost("ac").pj == pytest.approx(0.9)
    assert cmos.cost("mac", "fp32").pj == pytest.approx(3.7 + 0.9)
    assert cmos.cost("mac", "fp16").pj == pytest.approx(1.1 + 0.4)
    assert cmos.cost("mac", "int8").pj == pytest.approx(0.2 + 0.03)
    assert cmos.cost("ac", "int8").pj == pytest.approx(0.03)
    assert "Horowitz" in cmos.cost("mac").source


def test_neuromorphic_targets_cannot_do_real_valued_macs():
    loihi, truenorth = load_profile("loihi"), load_profile("truenorth")
    assert loihi.cost("mac") is None and truenorth.cost("mac") is None
    assert loihi.cost("ac").pj == pytest.approx(23.6)
    assert loihi.cost("neuron_update").pj == pytest.approx(81.0)
    assert truenorth.cost("ac").pj == pytest.approx(26.0)
    # TrueNorth's figure is all-in: neuron updates are inside it, not missing from the chip.
    assert truenorth.cost("neuron_update") is None
    assert truenorth.cost("ac").includes == ("neuron_update",)


def test_jetson_numbers_are_derived_from_the_datasheet():
    jetson = load_profile("jetson_orin_nano")
    fp32, int8 = jetson.cost("mac", "fp32"), jetson.cost("mac", "int8")
    assert fp32.basis == int8.basis == "derived"
    assert fp32.pj == pytest.approx(15 / (1024 * 625e6) * 1e12, rel=1e-3)  # 15 W over peak FMA rate
    assert int8.pj == pytest.approx(15 / (20e12 / 2) * 1e12)  # 15 W over 20 dense TOPS, 2 ops/MAC
    assert jetson.cost("ac") is None  # no event-driven accumulate: spike-fed layers run as dense MACs
    for precision in ("fp32", "int8"):  # a LIF step: three FP32 instructions on the CUDA cores, either way
        update = jetson.cost("neuron_update", precision)
        assert update.basis == "derived" and update.pj == pytest.approx(3 * fp32.pj, rel=1e-3)


def test_a_path_loads_like_a_name(tmp_path):
    assert load_profile(PROFILE_DIR / "loihi.toml") == load_profile("loihi")
    assert load_profile(str(write(tmp_path, GOOD))).cost("mac").pj == pytest.approx(4.6)


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(ProfileError, match="unknown hardware profile 'loihi3'") as error:
        load_profile("loihi3")
    assert all(name in str(error.value) for name in SHIPPED)


def test_unknown_precision_or_op_is_refused_with_the_file():
    cmos = load_profile("cmos45nm")
    with pytest.raises(ProfileError, match=r"hw_profiles/cmos45nm\.toml: ops\.int4: unknown precision") as error:
        cmos.cost("mac", "int4")
    assert "fp16, fp32, int8" in str(error.value)
    with pytest.raises(ProfileError, match=r"cmos45nm\.toml: op: unknown operation 'fma'"):
        cmos.cost("fma")


def test_profiles_are_frozen():
    with pytest.raises(ValidationError):
        load_profile("loihi").name = "other"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("pj = 4.6", "pj = -4.6", "ops.fp32.mac.pj: Input should be greater than 0"),
        ("pj = 4.6", "pj = 0", "ops.fp32.mac.pj: Input should be greater than 0"),
        ("pj = 4.6", 'pj = "4.6"', "ops.fp32.mac.pj: Input should be a valid number"),
        ("pj = 4.6", "pj = nan", "ops.fp32.mac.pj: Input should be a finite number"),
        ("pj = 4.6", "pj = true", "ops.fp32.mac.pj: Input should be a valid number"),
        ('source = "a test"\n\n', "\n", "ops.fp32.mac.source: Field required"),
        ('source = "a test"\n\n', 'source = "  "\n\n', "ops.fp32.mac.source: String should have at least 1"),
        ('basis = "published"', 'basis = "guessed"', "ops.fp32.mac.basis: Input should be 'measured'"),
        ('basis = "published"', 'basis = "published"\nunit = "pJ"', "ops.fp32.mac.unit: Extra inputs are not"),
        ("[ops.fp32.mac]", "[ops.fp32.fma]", "ops.fp32.fma: Extra inputs are not permitted"),
        ('name = "bad"', 'name = "bad"\nvendor = "x"', "vendor: Extra inputs are not permitted"),
        ('default_precision = "fp32"', 'default_precision = "fp64"', "default_precision: 'fp64' has no"),
        ('name = "bad"', 'name = "other"', "name: 'other' differs from the file name 'bad'"),
        ('source = "a test"\n\n', 'source = "a test"\nincludes = ["neuron_update"]\n\n', "mac.includes"),
        ('note = "3.7 + 0.9 + 0.9"\n', "", "ops.fp32.neuron_update.note: required for a derived number"),
        ("pj = 4.6", "pj = 4.6 pJ", "invalid TOML"),
        ("[ops.fp32.mac]", "[ops.fp32.mac", "line 5"),
    ],
)
def test_a_broken_profile_names_its_file_and_field(tmp_path, old, new, expected):
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ProfileError) as error:
        load_profile(path)
    message = str(error.value)
    assert "bad.toml" in message and expected in message, message


def test_an_empty_precision_table_is_refused(tmp_path):
    path = write(tmp_path, GOOD + "\n[ops.int8]\n")
    with pytest.raises(ProfileError, match=r"bad\.toml: ops\.int8: prices no operation"):
        load_profile(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ProfileError, match=r"nothere\.toml: cannot read the file"):
        load_profile(tmp_path / "nothere.toml")
