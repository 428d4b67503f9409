"""DNS-1123 names as apimachinery checks them (``k8s.io/apimachinery/pkg/util/validation``
``IsDNS1123Label``/``IsDNS1123Subdomain``; issue 27 item 5), and the one-pass check of kube-scheduler's
node-name lists against the per-name rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami_agent.protocol.names import all_subdomains, label_error, subdomain_error, uid_error

pytestmark = pytest.mark.unit

# apimachinery validation_test.go's good and bad values (TestIsDNS1123Label / TestIsDNS1123Subdomain)
GOOD_LABELS = ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2",
               "a" * 63]
BAD_LABELS = ["", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a",
              "a_b", "1_", "_1", "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ", " a", "a b",
              "1 ", " 1", "1 2", "a" * 64, "x\ud800", "é"]
GOOD_SUBDOMAINS = ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a",
                   "1--a--b--2", "a.a", "ab.a", "abc.a", "a1.a", "a-1.a", "a--1--2--b.a", "a.1", "ab.1",
                   "abc.1", "a1.1", "a-1.1", "a--1--2--b.1", "0.a", "01.a", "012.a", "1a.a", "1-a.a",
                   "1--a--b--2", "0.1", "01.1", "012.1", "1a.1", "1-a.1", "1--a--b--2.1", "a.b.c.d.e",
                   "aa.bb.cc.dd.ee", "1.2.3.4.5", "11.22.33.44.55", "a" * 253, "a" * 64]
BAD_SUBDOMAINS = ["", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a",
                  "a_b", "1_", "_1", "1_2", ".", "a.", ".a", "a..b", "1.", ".1", "1..2", " ", "a ", " a",
                  "a b", "1 ", " 1", "1 2", "A.a", "aB.a", "ab.A", "A1.a", "a1.A", "A.1", "aB.1", "A1.1",
                  "1A.1", "0.A", "01.A", "012.A", "1A.a", "1a.A", "A.B.C.D.E", "AA.BB.CC.DD.EE", "a.B.c.d.e",
                  "aa.bB.cc.dd.ee", "a@b", "a,b", "a_b", "a;b", "a:b", "a%b", "a?b", "a$b", "a" * 254,
                  "a-.b", "a.-b", "x\ud800", "\ud800", "a\nb", "é.a"]


@pytest.mark.parametrize("value", GOOD_LABELS)
def test_good_labels(value):
    assert label_error(value) is None


@pytest.mark.parametrize("value", BAD_LABELS)
def test_bad_labels(value):
    assert label_error(value)


@pytest.mark.parametrize("value", GOOD_SUBDOMAINS)
def test_good_subdomains(value):
    assert subdomain_error(value) is None
    assert all_subdomains(["gpu-0", value])


@pytest.mark.parametrize("value", BAD_SUBDOMAINS)
def test_bad_subdomains(value):
    assert subdomain_error(value)
    assert not all_subdomains(["gpu-0", value, "gpu-1"])


def test_errors_quote_the_value_safely():
    err = subdomain_error("x\ud800")
    assert "'x\\ud800'" in err  # repr: the message itself encodes as UTF-8
    err.encode()
    assert "no more than 253" in subdomain_error("a" * 300)


def test_uids():
    assert uid_error("0f2a4c6e-1b3d-4f5a-8c7e-9d0b1a2c3e4f") is None
    for bad in ("", "a b", "\ud800", "é", "a" * 129, "a\nb", 7):
        assert uid_error(bad)


names = st.lists(st.text(alphabet="ab-.0Z\n\ud800 ", max_size=6), max_size=4)


@settings(max_examples=3000, deadline=None, database=None)
@given(values=names)
def test_the_list_check_agrees_with_the_per_name_check(values):
    assert all_subdomains(values) == all(subdomain_error(v) is None for v in values)
