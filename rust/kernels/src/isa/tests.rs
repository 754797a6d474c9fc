use std::path::Path;

use super::*;

#[test]
fn names_round_trip_and_unknown_names_are_refused() {
    for isa in Isa::ALL {
        assert_eq!(Isa::parse(isa.name()), Ok(isa));
    }
    assert!(matches!(
        Isa::parse("avx1024"),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(Isa::from_u8(200), Isa::Avx512Bf16);
}

#[test]
fn ceilings_name_a_tier_and_whether_avx_vnni_counts_within_it() {
    let parsed: Vec<(Isa, bool)> = Ceiling::NAMES
        .iter()
        .map(|name| {
            let ceiling = Ceiling::parse(name).unwrap();
            (ceiling.tier, ceiling.avx_vnni)
        })
        .collect();
    assert_eq!(
        parsed,
        [
            (Isa::Scalar, false),
            (Isa::Avx2, false),
            (Isa::Avx2, true),
            (Isa::Avx512, false),
            (Isa::Avx512Vnni, true),
            (Isa::Avx512Bf16, true),
        ]
    );
    let Err(Error::InvalidArgument(message)) = Ceiling::parse("avx1024") else {
        panic!("an unknown name was taken");
    };
    assert!(message.contains("avx2_vnni"), "{message}");
}

#[test]
fn the_avx_vnni_token_needs_the_cpu_and_a_ceiling_that_counts_it() {
    let has = AvxVnni::detected().is_some();
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        has,
        std::arch::is_x86_feature_detected!("avxvnni") && detected() >= Isa::Avx2
    );
    for name in Ceiling::NAMES {
        let capped = Ceiling::parse(name).unwrap();
        assert_eq!(
            AvxVnni::within(capped).is_some(),
            has && capped.avx_vnni && capped.tier >= Isa::Avx2,
            "{name}"
        );
    }
}

#[test]
fn tiers_are_ordered_and_the_active_one_never_exceeds_the_cpu() {
    assert!(Isa::ALL.windows(2).all(|pair| pair[0] < pair[1]));
    assert!(active() <= detected());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_detected_tier_is_the_longest_run_of_features_the_cpu_has() {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let avx512 = avx2 && has!("avx512f") && has!("avx512bw");
    let vnni = avx512 && has!("avx512vnni");
    let bf16 = vnni && has!("avx512bf16");
    let expected = [avx2, avx512, vnni, bf16]
        .iter()
        .filter(|&&present| present)
        .count();
    assert_eq!(detected(), Isa::ALL[expected]);
}

#[test]
fn tokens_exist_exactly_for_the_tiers_detection_proved() {
    let tier = detected();
    assert_eq!(Avx2::detected().is_some(), tier >= Isa::Avx2);
    assert_eq!(Avx512::detected().is_some(), tier >= Isa::Avx512);
    assert_eq!(Avx512Vnni::detected().is_some(), tier >= Isa::Avx512Vnni);
    assert_eq!(Avx512Bf16::detected().is_some(), tier >= Isa::Avx512Bf16);
    // Asking for a tier never yields one above the CPU's, nor above what was asked.
    for isa in Isa::ALL {
        assert_eq!(Avx512::at_most(isa).is_some(), isa.min(tier) >= Isa::Avx512);
    }
}

#[test]
fn the_amx_token_needs_the_cpu_the_top_tier_and_the_tiles_state() {
    let has = cpu().amx_tiles;
    assert!(!has || (amx_bf16() && detected() == Isa::Avx512Bf16));
    for isa in Isa::ALL {
        assert_eq!(
            AmxBf16::at_most(isa).is_some(),
            has && isa == Isa::Avx512Bf16
        );
    }
}

#[test]
fn each_tokens_features_include_the_lower_tokens() {
    let tiers = [
        Avx2::FEATURES,
        Avx512::FEATURES,
        Avx512Vnni::FEATURES,
        Avx512Bf16::FEATURES,
    ];
    for pair in tiers.windows(2) {
        let higher: Vec<&str> = pair[1].split(',').collect();
        assert!(pair[0].split(',').all(|f| higher.contains(&f)), "{pair:?}");
    }
}

/// A function compiled with `#[target_feature]`: where it is, what it enables, its parameters.
struct TierFunction {
    place: String,
    enabled: Vec<String>,
    parameters: String,
}

/// Every `#[target_feature]` function under `dir`, read from the sources.
fn tier_functions(dir: &Path, found: &mut Vec<TierFunction>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            tier_functions(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&path).unwrap();
            const ATTRIBUTE: &str = "#[target_feature(enable = \"";
            for (at, _) in source.match_indices(ATTRIBUTE) {
                let rest = &source[at + ATTRIBUTE.len()..];
                let enabled = &rest[..rest.find('"').unwrap()];
                let signature = &rest[rest.find("fn ").unwrap()..];
                let open = signature.find('(').unwrap();
                let mut depth = 0;
                let close = signature[open..]
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '(' => 1,
                            ')' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .unwrap()
                    .0;
                let line = source[..at].lines().count() + 1;
                found.push(TierFunction {
                    place: format!("{}:{line}", path.display()),
                    enabled: enabled.split(',').map(str::to_owned).collect(),
                    parameters: signature[open + 1..open + close].to_owned(),
                });
            }
        }
    }
}

/// The token type a parameter list takes (`name: Token`), if any.
fn token_of(parameters: &str) -> Option<&'static str> {
    const TOKENS: [(&str, &str); 6] = [
        ("Avx2", Avx2::FEATURES),
        ("AvxVnni", AvxVnni::FEATURES),
        ("Avx512", Avx512::FEATURES),
        ("Avx512Vnni", Avx512Vnni::FEATURES),
        ("Avx512Bf16", Avx512Bf16::FEATURES),
        ("AmxBf16", AmxBf16::FEATURES),
    ];
    parameters.split(',').find_map(|parameter| {
        let (_, ty) = parameter.split_once(':')?;
        TOKENS
            .iter()
            .find(|(name, _)| ty.trim() == *name)
            .map(|&(_, features)| features)
    })
}

#[test]
fn every_target_feature_function_takes_a_token_that_proves_its_features() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    tier_functions(&src, &mut found);
    let detection = src.join("isa.rs").display().to_string();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for function in found.iter().filter(|f| !f.place.starts_with(&detection)) {
        checked += 1;
        let proven = token_of(&function.parameters).map(|f| f.split(',').collect::<Vec<_>>());
        match proven {
            None => wrong.push(format!("{}: takes no token", function.place)),
            Some(proven) => {
                let unproven: Vec<&String> = function
                    .enabled
                    .iter()
                    .filter(|f| !proven.contains(&f.as_str()))
                    .collect();
                if !unproven.is_empty() {
                    wrong.push(format!(
                        "{}: its token does not prove {unproven:?}",
                        function.place
                    ));
                }
            }
        }
    }
    // The kernels' tiers hold dozens of such functions: finding none means the scan is broken.
    assert!(
        checked >= 30,
        "found only {checked} target_feature functions"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
