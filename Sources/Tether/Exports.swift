// The SDK's public vocabulary lives partly in TetherClientCore (statuses, options, results,
// policies, continuity outcomes) and TetherProtocol (JSONValue, Timetoken, EventKind); apps
// import only `Tether`. Both modules are re-exported whole because their `public` symbols are
// exactly that vocabulary: everything else in them (the subscribe machine, planners, classifier,
// request building, signing, wire codecs) is `package`. `scripts/check-public-api` fails when a
// symbol becomes public that docs/public-api.txt does not list (docs/public-api.md).
@_exported public import TetherClientCore
@_exported public import TetherProtocol
