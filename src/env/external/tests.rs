//! The external protocol through real programs: the shipped Python example, and small programs
//! that crash, hang or lie.

use super::*;

fn example(extra: &[(&str, &str)]) -> External {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/envs/external/guess_number.py");
    let mut params = vec![("command".to_string(), format!("python3 {script}"))];
    params.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    External::from_params(&params).unwrap_or_else(|e| panic!("{e}"))
}

/// A program given as Python source (`python3 -c SOURCE`).
fn python(source: &str, timeout: &str) -> External {
    let command = shlex::try_join(["python3", "-c", source]).unwrap_or_else(|e| panic!("{e}"));
    External::from_params(&[
        ("command".into(), command),
        ("step_timeout".into(), timeout.into()),
    ])
    .unwrap_or_else(|e| panic!("{e}"))
}

fn failure(result: Result<Step, StepError>) -> String {
    match result {
        Err(StepError::Failed(f)) => f.0,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn the_python_example_plays_through_the_protocol() {
    // Python: [random.Random(s).randint(1, 10) for s in range(8)] == [7, 3, 1, 4, 4, 10, 10, 6],
    // so seed 1 hides 3.
    let mut env = example(&[("high", "10")]);
    let first = env.reset(1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first, "Guess the number from 1 to 10. You have 7 guesses.");
    assert_eq!(env.action_format(), "a whole number from 1 to 10");
    assert_eq!(env.actions().len(), 10);
    assert_eq!(env.state_hash(), stable_hash(b"1-10-0"));
    // An action the program does not know leaves the state unchanged.
    let before = env.state_hash();
    match env.step("five") {
        Err(StepError::Invalid(why)) => assert!(why.contains("not a whole number"), "{why}"),
        other => panic!("expected an invalid action, got {other:?}"),
    }
    assert_eq!(env.state_hash(), before);
    let step = env.step("5").unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!((step.reward, step.done), (0.0, false));
    assert_eq!(
        step.observation,
        "5 is too high. It is between 1 and 4; 6 guesses left."
    );
    assert_eq!(env.actions(), ["1", "2", "3", "4"]);
    assert_eq!(env.state_hash(), stable_hash(b"1-4-1"));
    let step = env.step("3").unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!((step.reward, step.done), (1.0, true));
    assert_eq!(step.info["success"], true);
    // A reset starts over in the same program; another seed hides another number (seed 2: 1).
    env.reset(2).unwrap_or_else(|e| panic!("{e}"));
    let step = env.step("1").unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!((step.reward, step.done), (1.0, true));
}

#[test]
fn a_copy_replays_the_episode_into_its_own_program() {
    let mut env = example(&[("high", "10")]);
    env.reset(5).unwrap_or_else(|e| panic!("{e}"));
    env.step("5").unwrap_or_else(|e| panic!("{e:?}"));
    let mut copy = env.clone_box();
    assert_eq!(copy.state_hash(), env.state_hash());
    assert_eq!(copy.render_text(), env.render_text());
    // Seed 5 hides 10: both go on from "between 6 and 10" on their own.
    let a = env.step("8").unwrap_or_else(|e| panic!("{e:?}"));
    let b = copy.step("8").unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        a.observation,
        "8 is too low. It is between 9 and 10; 5 guesses left."
    );
    assert_eq!(a, b);
    let b = copy.step("10").unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!((b.reward, b.done), (1.0, true));
    // The original did not see the copy's move.
    assert_eq!(env.state_hash(), stable_hash(b"9-10-2"));
}

#[test]
fn a_program_that_crashes_is_a_failure_with_its_stderr_tail() {
    let mut env = python(
        "import sys; sys.stdin.readline(); sys.stderr.write('boom: no level 7\\n'); sys.exit(3)",
        "5",
    );
    let message = env.reset(7).err().map(|e| e.0).unwrap_or_default();
    assert!(
        message.contains("exited while answering 'reset'"),
        "{message}"
    );
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains("boom: no level 7"), "{message}");
    // The next use starts a new program (which crashes the same way), never a hang.
    let again = env.reset(7).err().map(|e| e.0).unwrap_or_default();
    assert!(again.contains("boom"), "{again}");
    // A step before any reset is refused, not sent.
    assert!(failure(env.step("1")).contains("step before reset"));
}

#[test]
fn a_program_that_hangs_is_stopped_at_the_step_timeout() {
    // It answers reset, then sleeps far past the 3 s timeout on the step (3 s: a program must be
    // able to start and answer reset in time on a loaded machine).
    let mut env = python(
        "import sys, time, json\n\
         sys.stdin.readline(); print(json.dumps({'observation': 'ready'}), flush=True)\n\
         sys.stdin.readline(); sys.stderr.write('thinking...\\n'); sys.stderr.flush(); time.sleep(60)",
        "3",
    );
    assert_eq!(env.reset(0).unwrap_or_default(), "ready");
    let message = failure(env.step("go"));
    assert!(
        message.contains("did not answer 'step' within 3 s"),
        "{message}"
    );
    assert!(message.contains("thinking..."), "{message}");
}

#[test]
fn a_program_that_answers_outside_the_protocol_is_a_failure() {
    let not_json = python(
        "import sys; sys.stdin.readline(); print('hello', flush=True)",
        "5",
    );
    let mut env = not_json;
    let message = env.reset(0).err().map(|e| e.0).unwrap_or_default();
    assert!(message.contains("not a JSON object: 'hello'"), "{message}");
    // A step reply without a reward.
    let mut env = python(
        "import sys, json\n\
         for line in sys.stdin: print(json.dumps({'observation': 'o', 'done': False}), flush=True)",
        "5",
    );
    env.reset(0).unwrap_or_else(|e| panic!("{e}"));
    let message = failure(env.step("a"));
    assert!(message.contains("finite number 'reward'"), "{message}");
    // Two lines for one request: the next request would read the stale one as its reply.
    let mut env = python(
        "import sys, json\n\
         for line in sys.stdin:\n\
         \x20   print(json.dumps({'observation': 'o', 'reward': 0.0, 'done': False}), flush=True)\n\
         \x20   print(json.dumps({'observation': 'extra'}), flush=True)",
        "5",
    );
    env.reset(0).unwrap_or_else(|e| panic!("{e}"));
    // Seen before the step is sent when it has arrived by then ("nobody asked for"); else the
    // step reads it as its reply, which lacks a reward. Either way the program fails.
    let message = failure(env.step("a"));
    assert!(
        message.contains("wrote a line nobody asked for")
            || message.contains("'reward' and a boolean 'done'"),
        "{message}"
    );
    // A reply that says it failed.
    let mut env = python(
        "import sys, json\n\
         for line in sys.stdin: print(json.dumps({'error': 'level file missing'}), flush=True)",
        "5",
    );
    let message = env.reset(0).err().map(|e| e.0).unwrap_or_default();
    assert!(
        message.contains("reported an error for 'reset': level file missing"),
        "{message}"
    );
}

#[test]
fn parameters_are_checked_and_a_missing_program_is_named() {
    let err = |params: &[(&str, &str)]| {
        let params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        External::from_params(&params).err().unwrap_or_default()
    };
    assert!(err(&[]).contains("needs command"));
    assert!(err(&[("command", "'unclosed")]).contains("quotes do not close"));
    assert!(err(&[("command", "x"), ("step_timeout", "0")]).contains("positive number"));
    assert!(err(&[("command", "x"), ("step_timeout", "1e30")]).contains("positive number"));
    assert!(err(&[("command", "x"), ("step_timeout", "inf")]).contains("positive number"));
    let mut env = External::from_params(&[("command".into(), "/no/such/program --x".into())])
        .unwrap_or_else(|e| panic!("{e}"));
    let message = env.reset(0).err().map(|e| e.0).unwrap_or_default();
    assert!(
        message.contains("'/no/such/program --x' could not start"),
        "{message}"
    );
}
