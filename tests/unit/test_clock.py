"""The one format of a log line's timestamp, and the one of a recorded moment."""

import re

from nvrx_appliance.clock import FORMAT, iso_utc, log_stamp

LOG_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_a_log_stamp_is_iso_8601_utc_with_milliseconds_and_z():
    assert log_stamp(1796282492.1239) == "2026-12-03T07:21:32.123Z"
    assert log_stamp(0) == "1970-01-01T00:00:00.000Z"
    assert LOG_STAMP.match(log_stamp())


def test_a_log_stamp_never_rounds_up_into_the_next_second():
    assert log_stamp(1796282492.9999) == "2026-12-03T07:21:32.999Z"


def test_stamps_sort_as_their_moments_do_and_agree_with_the_recorded_form():
    moments = [1796282491.5, 1796282492.001, 1796282492.010, 1796282492.1]
    stamps = [log_stamp(m) for m in moments]
    assert sorted(stamps) == stamps
    assert log_stamp(1796282492.5)[:19] + "Z" == iso_utc(1796282492.5)
    assert FORMAT.endswith("Z")
