//! Process metrics of vallumd itself, named as Prometheus' process collector names them (the
//! Go and Rust client libraries' `process_*` families), read from `/proc/self` at scrape time
//! with the `procfs` crate (Linux only; elsewhere none are registered):
//!
//! | scraped name | kind | from |
//! |---|---|---|
//! | `process_cpu_seconds_total` | counter | `stat`: utime + stime, in clock ticks |
//! | `process_resident_memory_bytes` | gauge | `stat`: rss pages x page size |
//! | `process_virtual_memory_bytes` | gauge | `stat`: vsize |
//! | `process_open_fds` | gauge | entries of `fd/` |
//! | `process_max_fds` | gauge | `limits`: "Max open files", soft limit |
//! | `process_start_time_seconds` | gauge | `stat`: starttime (ticks after boot) + `/proc/stat` btime, Unix seconds |
//! | `process_threads` | gauge | `stat`: num_threads |
//!
//! A read that fails (no `/proc`) observes nothing for that scrape. Instruments are created
//! without the unit's suffix (see [`super::exposition`]): `process_cpu` with unit `s` is
//! scraped as `process_cpu_seconds_total`.

use std::any::Any;

use opentelemetry::metrics::Meter;

/// Registers the process instruments on `meter`; the returned handles keep their callbacks
/// registered.
pub(super) fn register(meter: &Meter) -> Vec<Box<dyn Any + Send + Sync>> {
    imp::register(meter)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::any::Any;

    use opentelemetry::metrics::Meter;
    use procfs::process::{LimitValue, Process, Stat};

    fn stat() -> Option<Stat> {
        Process::myself().and_then(|p| p.stat()).ok()
    }

    pub(super) fn register(meter: &Meter) -> Vec<Box<dyn Any + Send + Sync>> {
        let ticks = procfs::ticks_per_second() as f64;
        let page = procfs::page_size();
        let mut keep: Vec<Box<dyn Any + Send + Sync>> = Vec::new();
        keep.push(Box::new(
            meter
                .f64_observable_counter("process_cpu")
                .with_unit("s")
                .with_description("Total user and system CPU time spent in seconds.")
                .with_callback(move |obs| {
                    if let Some(s) = stat() {
                        obs.observe((s.utime + s.stime) as f64 / ticks, &[]);
                    }
                })
                .build(),
        ));
        keep.push(Box::new(
            meter
                .u64_observable_gauge("process_resident_memory")
                .with_unit("By")
                .with_description("Resident memory size in bytes.")
                .with_callback(move |obs| {
                    if let Some(s) = stat() {
                        obs.observe(s.rss.saturating_mul(page), &[]);
                    }
                })
                .build(),
        ));
        keep.push(Box::new(
            meter
                .u64_observable_gauge("process_virtual_memory")
                .with_unit("By")
                .with_description("Virtual memory size in bytes.")
                .with_callback(|obs| {
                    if let Some(s) = stat() {
                        obs.observe(s.vsize, &[]);
                    }
                })
                .build(),
        ));
        keep.push(Box::new(
            meter
                .u64_observable_gauge("process_open_fds")
                .with_description("Number of open file descriptors.")
                .with_callback(|obs| {
                    if let Ok(n) = Process::myself().and_then(|p| p.fd_count()) {
                        obs.observe(n as u64, &[]);
                    }
                })
                .build(),
        ));
        keep.push(Box::new(
            meter
                .u64_observable_gauge("process_max_fds")
                .with_description("Maximum number of open file descriptors (the soft limit).")
                .with_callback(|obs| {
                    let limit = Process::myself()
                        .and_then(|p| p.limits())
                        .map(|l| l.max_open_files.soft_limit);
                    match limit {
                        Ok(LimitValue::Value(n)) => obs.observe(n, &[]),
                        Ok(LimitValue::Unlimited) => obs.observe(u64::MAX, &[]),
                        Err(_) => {}
                    }
                })
                .build(),
        ));
        keep.push(Box::new(
            meter
                .f64_observable_gauge("process_start_time")
                .with_unit("s")
                .with_description("Start time of the process since unix epoch in seconds.")
                .with_callback(move |obs| {
                    if let (Some(s), Ok(boot)) = (stat(), procfs::boot_time_secs()) {
                        obs.observe(boot as f64 + s.starttime as f64 / ticks, &[]);
                    }
                })
                .build(),
        ));
        keep.push(Box::new(
            meter
                .u64_observable_gauge("process_threads")
                .with_description("Number of OS threads in the process.")
                .with_callback(|obs| {
                    if let Some(s) = stat() {
                        obs.observe(u64::try_from(s.num_threads).unwrap_or(0), &[]);
                    }
                })
                .build(),
        ));
        keep
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::any::Any;

    use opentelemetry::metrics::Meter;

    pub(super) fn register(_: &Meter) -> Vec<Box<dyn Any + Send + Sync>> {
        Vec::new()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use crate::telemetry::metrics::{Metrics, MetricsConfig};

    fn value(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }

    /// Every family is scraped with the process' real figures: the fds include one this test
    /// holds open, the start time is before now and after boot, the RSS is what /proc says
    /// within a factor of two (the scrape itself allocates).
    #[test]
    fn process_metrics_read_proc_self() {
        let m = Metrics::new(&MetricsConfig::default()).unwrap();
        let held = std::fs::File::open("/proc/self/stat").unwrap();
        let text = m.render().unwrap();
        for (name, kind) in [
            ("process_cpu_seconds_total", "counter"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_virtual_memory_bytes", "gauge"),
            ("process_open_fds", "gauge"),
            ("process_max_fds", "gauge"),
            ("process_start_time_seconds", "gauge"),
            ("process_threads", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind}:\n{text}"
            );
        }
        let fds = std::fs::read_dir("/proc/self/fd").unwrap().count() as f64;
        let open = value(&text, "process_open_fds");
        assert!(open >= 1.0 && (open - fds).abs() <= 4.0, "{open} vs {fds}");
        assert!(value(&text, "process_max_fds") >= open);
        let now = crate::clock::Clock::system().unix_ns() as f64 / 1e9;
        let start = value(&text, "process_start_time_seconds");
        let boot = procfs::boot_time_secs().unwrap() as f64;
        assert!(
            boot <= start && start <= now + 1.0,
            "{boot} <= {start} <= {now}"
        );
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        let rss = value(&text, "process_resident_memory_bytes");
        let want = pages * procfs::page_size() as f64;
        assert!(rss > want / 2.0 && rss < want * 2.0, "{rss} vs {want}");
        assert!(value(&text, "process_cpu_seconds_total") >= 0.0);
        assert!(value(&text, "process_threads") >= 1.0);
        drop(held);
    }
}
