"""tools/benchkit.py's pure parts: median_range, the /proc/<pid>/io counters (against a real
read of a file written here), the peak RSS, the machine record's fields, the JSON writer.
What needs root (dropping the page cache, cgroups) or times the disk is not run here."""

from __future__ import annotations

import doctest
import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from tools import benchkit

# The counters come from Linux's /proc (the benchmarks' platform: cgroups, drop_caches); on
# Linux an unreadable /proc is a failure, elsewhere the tests have nothing to read.
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="/proc/<pid>/io and status are Linux's")


def test_doctests_pass():
    result = doctest.testmod(benchkit)
    assert result.failed == 0 and result.attempted >= 3


def test_median_range_keeps_the_runs_in_their_order():
    assert benchkit.median_range([5.0, 1.0, 4.0, 2.0]) == {"median": 3.0, "min": 1.0, "max": 5.0,
                                                          "runs": [5.0, 1.0, 4.0, 2.0]}
    assert benchkit.median_range([7]) == {"median": 7, "min": 7, "max": 7, "runs": [7]}


def test_proc_io_parses_every_counter_as_an_int():
    text = "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
    assert benchkit.parse_proc_io(text) == {"rchar": 1, "wchar": 2, "syscr": 3, "syscw": 4, "read_bytes": 4096,
                                            "write_bytes": 0, "cancelled_write_bytes": 0}


@linux_only
def test_proc_io_counts_a_real_read(tmp_path):
    # A child reads a file this test wrote: its rchar grows by at least the file's size
    # (read_bytes may stay 0: the file is in the page cache).
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(1 << 20))
    script = textwrap.dedent(f"""
        import json
        from tools import benchkit
        before = benchkit.proc_io()
        with open({str(path)!r}, "rb") as fh:
            while fh.read(1 << 16):
                pass
        after = benchkit.proc_io()
        print(json.dumps({{"before": before, "after": after}}))
    """)
    repo = str(benchkit.Path(benchkit.__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=repo, check=True)
    got = json.loads(proc.stdout)
    assert set(got["before"]) >= {"rchar", "read_bytes"}
    assert all(isinstance(v, int) for v in got["after"].values())
    assert got["after"]["rchar"] - got["before"]["rchar"] >= 1 << 20


def test_proc_io_of_no_process_is_empty():
    assert benchkit.proc_io(2**31 - 1) == {}


@linux_only
def test_vm_hwm_is_at_least_the_current_rss():
    hwm = benchkit.vm_hwm_bytes()
    assert hwm is not None
    rss = int(benchkit.Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert hwm >= rss > 0
    assert benchkit.vm_hwm_bytes(2**31 - 1) is None


def test_machine_record_has_the_named_fields_in_order_then_extra():
    record = benchkit.machine_record("cpu", "cores", "cpus", "cpu_count", "python", "platform", "numpy",
                                     "mem_total_bytes", note="x", loadavg_at_start=[0.0, 0.0, 0.0])
    assert list(record) == ["cpu", "cores", "cpus", "cpu_count", "python", "platform", "numpy", "mem_total_bytes",
                            "note", "loadavg_at_start"]
    assert record["cores"] == record["cpus"] == record["cpu_count"] == os.cpu_count()
    assert record["python"] == platform.python_version() and record["platform"] == platform.platform()
    assert isinstance(record["cpu"], str)
    assert record["numpy"] == __import__("numpy").__version__
    assert record["mem_total_bytes"] > 1 << 20
    assert record["note"] == "x"


def test_machine_record_refuses_an_unknown_fact():
    with pytest.raises(ValueError, match="unknown machine facts \\['ram'\\]"):
        benchkit.machine_record("python", "ram")


def test_sysfs_int_and_read_ahead(tmp_path):
    (tmp_path / "n").write_text("128\n")
    (tmp_path / "s").write_text("none\n")
    assert benchkit.sysfs_int(tmp_path / "n") == 128
    assert benchkit.sysfs_int(tmp_path / "s") is None and benchkit.sysfs_int(tmp_path / "missing") is None
    value = benchkit.read_ahead_kb(tmp_path)
    assert value is None or value >= 0
    assert benchkit.read_ahead_kb(tmp_path / "missing") is None


@pytest.mark.parametrize(("indent", "final_newline"), [(1, True), (2, False)])
def test_write_json_creates_the_folder(tmp_path, indent, final_newline):
    path = tmp_path / "a" / "b" / "out.json"
    data = {"x": [1, 2], "y": None}
    benchkit.write_json(path, data, indent=indent, final_newline=final_newline)
    assert path.read_text() == json.dumps(data, indent=indent) + ("\n" if final_newline else "")


def test_command_line_names_the_script_and_its_arguments():
    assert benchkit.command_line("tools/bench_x.py", ["--quick", "--json", "o.json"]) == \
        "python tools/bench_x.py --quick --json o.json"


def test_run_capped_without_a_cap_reports_the_cap_fields_as_none():
    run = benchkit.run_capped([sys.executable, "-c", "print('hi')"], None, "unused")
    assert run["returncode"] == 0 and run["stdout"] == "hi\n" and run["peak_rss_bytes"] > 0
    assert (run["cap_bytes"], run["cgroup_peak_bytes"], run["cap_hits"], run["oom_kills"]) == (None,) * 4


def test_benchkit_needs_only_the_standard_library():
    # bench_outofcore.py imports it in DGL's interpreter, which has no graphstore (nor, maybe, numpy).
    code = ("import sys; sys.modules['numpy'] = sys.modules['torch'] = sys.modules['graphstore'] = None; "
            "from tools import benchkit")
    repo = str(benchkit.Path(benchkit.__file__).resolve().parents[1])
    subprocess.run([sys.executable, "-c", code], cwd=repo, check=True)
