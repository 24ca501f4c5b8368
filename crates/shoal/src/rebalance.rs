//! `shoal rebalance`: simulate allocation strategies over membership changes.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;
use shoal_group::allocate::{minimum_moves, moved_queues};
use shoal_group::{
    strategy_by_name, AllocateStrategy, AllocationContext, AllocationInput, Assignment,
};
use shoal_proto::MessageQueue;

/// Strategies `all` stands for (CONFIG needs a configured list, the machine-room ones need
/// rooms: name them explicitly).
const ALL: &[&str] = &[
    "AVG",
    "AVG_BY_CIRCLE",
    "CONSISTENT_HASH",
    "RANGE",
    "ROUND_ROBIN",
    "STICKY",
    "COOPERATIVE_STICKY",
    "BALANCED_STICKY",
];

/// `shoal rebalance` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum RebalanceCommand {
    /// Run strategies over a sequence of membership changes and report, per step and
    /// strategy: load per member (min/max), queues moved, queues moved beyond the minimum a
    /// balanced assignment needs, and whether ownership is exclusive and complete.
    ///
    /// Example: shoal rebalance simulate --queues 16 --members 4
    ///   --steps "join,leave:c2,crash:mid,join:c9=hz" --strategy avg,balanced-sticky --show
    Simulate(SimulateArgs),
    /// The movement table: for every size 1..=N members, one join then one leave of a middle
    /// member; moves summed per strategy against the minimum.
    Sweep(SweepArgs),
}

/// Queue layout shared by both subcommands.
#[derive(Debug, Args)]
pub(crate) struct QueueArgs {
    /// Topic names, comma-separated.
    #[arg(long, default_value = "TopicTest", value_delimiter = ',')]
    topics: Vec<String>,
    /// Queues per topic on each broker.
    #[arg(long, default_value_t = 64)]
    queues: u32,
    /// Broker names, comma-separated; `room@name` places a broker in a machine room (as
    /// RocketMQ's machine-room strategies expect).
    #[arg(long, default_value = "broker-a", value_delimiter = ',')]
    brokers: Vec<String>,
    /// Strategy names, comma-separated (AVG, AVG_BY_CIRCLE, CONSISTENT_HASH[:n],
    /// MACHINE_ROOM, MACHINE_ROOM_NEARBY[-INNER], RANGE, ROUND_ROBIN, STICKY,
    /// COOPERATIVE_STICKY, BALANCED_STICKY; case and -/_ do not matter), or `all`.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    strategy: Vec<String>,
    /// Machine rooms whose queues MACHINE_ROOM allocates (default: every broker room).
    #[arg(long, value_delimiter = ',')]
    consume_rooms: Vec<String>,
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// `shoal rebalance simulate` arguments.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    #[command(flatten)]
    layout: QueueArgs,
    /// Initial members: a count (named c1..cN) or a comma-separated list of `id[=room]`.
    #[arg(long, default_value = "4")]
    members: String,
    /// Membership changes, comma-separated: `join[:id[=room]]` (default id: the next cN),
    /// `leave[:id|mid]` (graceful: its queues are reassigned at once), `crash[:id|mid]`
    /// (the member stops but stays listed until its heartbeat expires: one row with its
    /// queues stalled, then an `expire` row). `mid` (the default) is the middle member in
    /// sorted order.
    #[arg(long, default_value = "join,leave:mid")]
    steps: String,
    /// Print the assignment matrix of every step (one row per member, one column per queue:
    /// `#` owned, `.` not; `x` owned by a crashed member).
    #[arg(long)]
    show: bool,
}

/// `shoal rebalance sweep` arguments.
#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    layout: QueueArgs,
    /// Largest group size before the join.
    #[arg(long, default_value_t = 16)]
    max_members: usize,
}

/// Runs a `shoal rebalance` subcommand.
pub(crate) fn run(cmd: RebalanceCommand) -> Result<()> {
    match cmd {
        RebalanceCommand::Simulate(a) => simulate(a),
        RebalanceCommand::Sweep(a) => sweep(a),
    }
}

struct Setup {
    queues: Vec<MessageQueue>,
    strategies: Vec<Box<dyn AllocateStrategy>>,
    context: AllocationContext,
}

fn setup(l: &QueueArgs) -> Result<Setup> {
    let mut queues = Vec::new();
    for t in &l.topics {
        for b in &l.brokers {
            for q in 0..l.queues {
                let id = i32::try_from(q).context("too many queues")?;
                queues.push(MessageQueue::new(t.as_str(), b.as_str(), id));
            }
        }
    }
    let names: Vec<String> = if l.strategy.iter().any(|s| s.eq_ignore_ascii_case("all")) {
        ALL.iter().map(|s| s.to_string()).collect()
    } else {
        l.strategy.clone()
    };
    let mut strategies = Vec::new();
    for n in &names {
        let s = strategy_by_name(n)?;
        if s.name() == "CONFIG" {
            bail!("CONFIG allocates a configured list; there is nothing to simulate");
        }
        strategies.push(s);
    }
    let consume_rooms = if l.consume_rooms.is_empty() {
        l.brokers
            .iter()
            .filter_map(|b| shoal_group::allocate::broker_machine_room(b).map(str::to_string))
            .collect()
    } else {
        l.consume_rooms.iter().cloned().collect()
    };
    let context = AllocationContext {
        consume_rooms,
        ..Default::default()
    };
    Ok(Setup {
        queues,
        strategies,
        context,
    })
}

/// One allocation after a change; cooperative strategies run until nothing is pending.
fn rebalance(
    s: &dyn AllocateStrategy,
    queues: &[MessageQueue],
    members: &[String],
    base: &AllocationContext,
    previous: &Assignment,
) -> Result<(Assignment, usize)> {
    let mut prev = previous.clone();
    let mut rounds = 0;
    loop {
        rounds += 1;
        let mut ctx = base.clone();
        ctx.previous = Some(prev.clone());
        let input = AllocationInput::new("sim", queues.iter().cloned(), members.iter().cloned())
            .with_context(&ctx);
        let next = s.allocate_all(&input)?;
        let settled = next == prev || !s.name().starts_with("COOPERATIVE") || rounds >= 4;
        prev = next;
        if settled || prev.coverage(queues).unowned == 0 {
            return Ok((prev, rounds));
        }
    }
}

#[derive(Debug, Serialize)]
struct Row {
    strategy: String,
    min_load: usize,
    max_load: usize,
    moved: usize,
    minimum_moves: usize,
    beyond_minimum: i64,
    exclusive: bool,
    complete: bool,
    rounds: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    assignment: Option<Assignment>,
}

#[derive(Debug, Serialize)]
struct StepReport {
    step: String,
    members: Vec<String>,
    crashed: Vec<String>,
    results: Vec<Row>,
}

enum Step {
    Join(String, Option<String>),
    Leave(String),
    Crash(String),
}

fn parse_member(spec: &str) -> (String, Option<String>) {
    match spec.split_once('=') {
        Some((id, room)) => (id.to_string(), Some(room.to_string())),
        None => (spec.to_string(), None),
    }
}

fn simulate(a: SimulateArgs) -> Result<()> {
    let Setup {
        queues,
        strategies,
        mut context,
    } = setup(&a.layout)?;
    let mut members: Vec<String> = Vec::new();
    let mut next_id = 1usize;
    if let Ok(n) = a.members.trim().parse::<usize>() {
        for _ in 0..n {
            members.push(format!("c{next_id}"));
            next_id += 1;
        }
    } else {
        for spec in a.members.split(',').filter(|s| !s.trim().is_empty()) {
            let (id, room) = parse_member(spec.trim());
            if let Some(r) = room {
                context.member_zones.insert(id.clone(), r);
            }
            members.push(id);
        }
        next_id = members.len() + 1;
    }
    let sorted = |m: &[String]| -> Vec<String> {
        AllocationInput::new("sim", Vec::new(), m.iter().cloned())
            .members()
            .to_vec()
    };
    let middle = |m: &[String]| -> Result<String> {
        let s = sorted(m);
        s.get(s.len() / 2)
            .cloned()
            .context("no member left to remove")
    };
    let mut steps = Vec::new();
    for raw in a.steps.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (verb, arg) = match raw.split_once(':') {
            Some((v, x)) => (v, Some(x)),
            None => (raw, None),
        };
        steps.push(match verb.to_ascii_lowercase().as_str() {
            "join" => {
                let (id, room) = arg.map(parse_member).unwrap_or((String::new(), None));
                Step::Join(id, room)
            }
            "leave" => Step::Leave(arg.unwrap_or("mid").to_string()),
            "crash" => Step::Crash(arg.unwrap_or("mid").to_string()),
            other => bail!("unknown step {other:?} (join, leave, crash)"),
        });
    }

    let mut state: Vec<Assignment> = vec![Assignment::new(); strategies.len()];
    let mut reports = Vec::new();
    let evaluate = |label: String,
                    context: &AllocationContext,
                    members: &[String],
                    crashed: &[String],
                    reassign: bool,
                    state: &mut Vec<Assignment>|
     -> Result<StepReport> {
        let mut results = Vec::new();
        for (s, prev) in strategies.iter().zip(state.iter_mut()) {
            let (next, rounds) = if reassign {
                rebalance(s.as_ref(), &queues, members, context, prev)
                    .with_context(|| format!("{} at step {label}", s.name()))?
            } else {
                (prev.clone(), 0)
            };
            let live: Vec<String> = members
                .iter()
                .filter(|m| !crashed.contains(m))
                .cloned()
                .collect();
            let mut live_view = Assignment::new();
            for m in &live {
                live_view.insert(m.clone(), next.queues_of(m).to_vec());
            }
            let cov = live_view.coverage(&queues);
            let (min_load, max_load) = next.load_range();
            let moved = moved_queues(prev, &next);
            let minimum = minimum_moves(prev, &queues, &sorted(members));
            results.push(Row {
                strategy: s.name(),
                min_load,
                max_load,
                moved,
                minimum_moves: minimum,
                beyond_minimum: moved as i64 - minimum as i64,
                exclusive: next.coverage(&queues).shared == 0,
                complete: cov.unowned == 0 && !live.is_empty(),
                rounds,
                assignment: a.show.then(|| next.clone()),
            });
            *prev = next;
        }
        Ok(StepReport {
            step: label,
            members: sorted(members),
            crashed: crashed.to_vec(),
            results,
        })
    };

    reports.push(evaluate(
        format!("start ({} members)", members.len()),
        &context,
        &members,
        &[],
        true,
        &mut state,
    )?);
    for step in steps {
        match step {
            Step::Join(id, room) => {
                let id = if id.is_empty() {
                    loop {
                        let c = format!("c{next_id}");
                        next_id += 1;
                        if !members.contains(&c) {
                            break c;
                        }
                    }
                } else {
                    id
                };
                if let Some(r) = room {
                    context.member_zones.insert(id.clone(), r);
                }
                members.push(id.clone());
                reports.push(evaluate(
                    format!("join {id}"),
                    &context,
                    &members,
                    &[],
                    true,
                    &mut state,
                )?);
            }
            Step::Leave(id) => {
                let id = if id == "mid" { middle(&members)? } else { id };
                if !members.contains(&id) {
                    bail!("leave: {id} is not a member");
                }
                members.retain(|m| *m != id);
                reports.push(evaluate(
                    format!("leave {id}"),
                    &context,
                    &members,
                    &[],
                    true,
                    &mut state,
                )?);
            }
            Step::Crash(id) => {
                let id = if id == "mid" { middle(&members)? } else { id };
                if !members.contains(&id) {
                    bail!("crash: {id} is not a member");
                }
                let crashed = [id.clone()];
                reports.push(evaluate(
                    format!("crash {id}"),
                    &context,
                    &members,
                    &crashed,
                    false,
                    &mut state,
                )?);
                members.retain(|m| *m != id);
                reports.push(evaluate(
                    format!("expire {id}"),
                    &context,
                    &members,
                    &[],
                    true,
                    &mut state,
                )?);
            }
        }
    }

    if a.layout.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "queues": queues.len(),
                "steps": reports,
            }))?
        );
        return Ok(());
    }
    println!("{} queues", queues.len());
    let w = strategies
        .iter()
        .map(|s| s.name().len())
        .max()
        .unwrap_or(8)
        .max(28);
    for r in &reports {
        println!();
        println!("== {} -> {} members", r.step, r.members.len());
        println!(
            "{:<w$} {:>5} {:>5} {:>6} {:>8} {:>11} {:>10} {:>9} {:>7}",
            "strategy",
            "min",
            "max",
            "moved",
            "minimum",
            "beyond-min",
            "exclusive",
            "complete",
            "rounds"
        );
        for row in &r.results {
            println!(
                "{:<w$} {:>5} {:>5} {:>6} {:>8} {:>11} {:>10} {:>9} {:>7}",
                row.strategy,
                row.min_load,
                row.max_load,
                row.moved,
                row.minimum_moves,
                row.beyond_minimum,
                yes(row.exclusive),
                yes(row.complete),
                row.rounds
            );
        }
        if a.show {
            for row in &r.results {
                if let Some(asg) = &row.assignment {
                    println!("  {}:", row.strategy);
                    for m in &r.members {
                        let owned = asg.queues_of(m);
                        let mark = if r.crashed.contains(m) { 'x' } else { '#' };
                        let line: String = queues
                            .iter()
                            .map(|q| if owned.contains(q) { mark } else { '.' })
                            .collect();
                        println!("    {m:<12} {line} {}", owned.len());
                    }
                }
            }
        }
    }
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

#[derive(Debug, Serialize)]
struct SweepRow {
    strategy: String,
    moved: usize,
    minimum_moves: usize,
    ratio: f64,
    max_spread: usize,
    always_exclusive_and_complete: bool,
}

fn sweep(a: SweepArgs) -> Result<()> {
    let Setup {
        queues,
        strategies,
        context,
    } = setup(&a.layout)?;
    let names = |k: usize| -> Vec<String> { (1..=k).map(|i| format!("c{i}")).collect() };
    let mut rows = Vec::new();
    for s in &strategies {
        let mut moved = 0;
        let mut minimum = 0;
        let mut spread = 0;
        let mut ok = true;
        for k in 1..=a.max_members {
            let start = names(k);
            let (before, _) = rebalance(s.as_ref(), &queues, &start, &context, &Assignment::new())?;
            let joined = names(k + 1);
            let (after, _) = rebalance(s.as_ref(), &queues, &joined, &context, &before)?;
            moved += moved_queues(&before, &after);
            minimum += minimum_moves(&before, &queues, &joined);
            let sorted = AllocationInput::new("sim", Vec::new(), joined.iter().cloned())
                .members()
                .to_vec();
            let mid = sorted.get(sorted.len() / 2).cloned().unwrap_or_default();
            let left: Vec<String> = sorted.into_iter().filter(|m| *m != mid).collect();
            let (last, _) = rebalance(s.as_ref(), &queues, &left, &context, &after)?;
            moved += moved_queues(&after, &last);
            minimum += minimum_moves(&after, &queues, &left);
            for (asg, m) in [(&after, &joined), (&last, &left)] {
                let (lo, hi) = asg.load_range();
                spread = spread.max(hi - lo);
                let c = asg.coverage(&queues);
                ok &= c.is_exclusive_and_complete() || m.is_empty();
            }
        }
        rows.push(SweepRow {
            strategy: s.name(),
            moved,
            minimum_moves: minimum,
            ratio: if minimum == 0 {
                0.0
            } else {
                moved as f64 / minimum as f64
            },
            max_spread: spread,
            always_exclusive_and_complete: ok,
        });
    }
    if a.layout.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{} queues, 1..={} members, one join then one leave (middle member) at each size",
        queues.len(),
        a.max_members
    );
    println!(
        "{:<22} {:>6} {:>8} {:>7} {:>11} {:>20}",
        "strategy", "moved", "minimum", "ratio", "max spread", "exclusive+complete"
    );
    for r in &rows {
        println!(
            "{:<22} {:>6} {:>8} {:>7.2} {:>11} {:>20}",
            r.strategy,
            r.moved,
            r.minimum_moves,
            r.ratio,
            r.max_spread,
            yes(r.always_exclusive_and_complete)
        );
    }
    Ok(())
}
