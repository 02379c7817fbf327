import Testing
@testable import TetherClientCore
import TetherProtocol

/// Message actions as data: the requests the SDK builds and the PubNub shapes it decodes (the
/// bodies recorded by PubNub's own SDK fixtures).
@Suite("Message actions: requests and decoding")
struct MessageActionCodingTests {
    let e = Endpoints(context: RequestContext(publishKey: "pub", subscribeKey: "sub", userId: "me", authKey: "tok"))

    @Test func requests() throws {
        let add = try e.addMessageAction(channel: "ch 1", messageTimetoken: Timetoken(15610547826969050), type: "reaction", value: "smile")
        #expect(add.method == .post && add.operation == .addMessageAction)
        #expect(add.path == "/v1/message-actions/sub/channel/ch%201/message/15610547826969050")
        #expect(add.body.map { String(decoding: $0, as: UTF8.self) } == #"{"type":"reaction","value":"smile"}"#)
        #expect(add.queryValue("uuid") == "me" && add.queryValue("auth") == "tok")
        let remove = try e.removeMessageAction(channel: "c", messageTimetoken: Timetoken(1), actionTimetoken: Timetoken(2))
        #expect(remove.method == .delete && remove.path == "/v1/message-actions/sub/channel/c/message/1/action/2")
        let get = try e.fetchMessageActions(channel: "c", start: Timetoken(9), end: Timetoken(3), limit: 10)
        #expect(get.path == "/v1/message-actions/sub/channel/c")
        #expect(get.queryValue("start") == "9" && get.queryValue("end") == "3" && get.queryValue("limit") == "10")
        #expect(throws: RequestBuildError.self) { try e.addMessageAction(channel: "c", messageTimetoken: Timetoken(1), type: String(repeating: "t", count: 16), value: "v") }
        #expect(throws: RequestBuildError.self) { try e.fetchMessageActions(channel: "c", start: nil, end: nil, limit: 101) }
        let history = try e.fetch(channels: ["c"], options: FetchOptions(includeActions: true))
        #expect(history.path == "/v3/history-with-actions/sub-key/sub/channel/c" && history.queryValue("max") == "25")
        #expect(throws: RequestBuildError.self) { try e.fetch(channels: ["a", "b"], options: FetchOptions(includeActions: true)) }
    }

    @Test func decodesPubNubShapes() throws {
        let page = try ResponseDecoding.messageActionsPage(JSONValue(parsing: """
            {"status":200,"data":[{"type":"reaction","value":"smiley_face","actionTimetoken":"15610547826970050",
            "messageTimetoken":"15610547826969050","uuid":"terryterry69420"}],
            "more":{"url":"/v1/actions/sub/channel/c?start=15610547826970050&limit=2","start":"15610547826970050","limit":2}}
            """))
        #expect(page.actions == [MessageAction(type: "reaction", value: "smiley_face", userId: "terryterry69420",
                                               actionTimetoken: Timetoken(15610547826970050), messageTimetoken: Timetoken(15610547826969050))])
        #expect(page.nextStart == Timetoken(15610547826970050))

        let fetched = try ResponseDecoding.fetch(JSONValue(parsing: """
            {"status":200,"channels":{"c":[{"message":"hi","timetoken":"15724676552283948","meta":"",
            "actions":{"reaction":{"smiley_face":[{"uuid":"otheruser","actionTimetoken":"15724677187827310"},
            {"uuid":"db9c","actionTimetoken":"15724676661630010"}]}}},{"message":"x","timetoken":"15724678349095456"}]},
            "error_message":"","error":false}
            """))
        let messages = fetched.channels["c"] ?? []
        #expect(messages.first?.actions.map(\.userId) == ["db9c", "otheruser"])
        #expect(messages.first?.actions.first?.messageTimetoken == Timetoken(15724676552283948))
        #expect(messages.last?.actions == [])

        let event = ReceivedEvent(timetoken: Timetoken(15725459794105070), channel: "TestChannel", subscription: nil,
                                  payload: try JSONValue(parsing: """
                                      {"source":"actions","version":"1.0","data":{"messageTimetoken":"15725459448096144",
                                      "type":"reaction","value":"winky_face","actionTimetoken":"15725459793173220"},"event":"added"}
                                      """), publisher: "SomeUser", meta: nil, kind: .messageAction, customMessageType: nil)
        #expect(event.messageAction == MessageActionEvent(
            change: .added, action: MessageAction(type: "reaction", value: "winky_face", userId: "SomeUser",
                                                  actionTimetoken: Timetoken(15725459793173220), messageTimetoken: Timetoken(15725459448096144)),
            channel: "TestChannel", timetoken: Timetoken(15725459794105070)))
    }
}
