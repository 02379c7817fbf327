import Testing
@testable import TetherClientCore
import TetherProtocol

/// App Context as data: the requests the SDK builds and the PubNub shapes it decodes (bodies
/// recorded by PubNub's Python SDK fixtures and captured objects events).
@Suite("App Context: requests and decoding")
struct AppContextCodingTests {
    let e = Endpoints(context: RequestContext(publishKey: "pub", subscribeKey: "sub", userId: "me", authKey: "tok"))

    @Test func requests() throws {
        let set = try e.setUserMetadata(UserMetadata(id: "u 1", name: "N", custom: ["a": 1]), ifMatchesETag: "abc")
        #expect(set.method == .patch && set.operation == .setUserMetadata && set.path == "/v2/objects/sub/uuids/u%201")
        #expect(set.body.map { String(decoding: $0, as: UTF8.self) } == #"{"custom":{"a":1},"name":"N"}"#)
        #expect(set.headers == ["If-Match": "abc"] && set.queryValue("include") == "custom,status,type")
        #expect(set.queryValue("uuid") == "me" && set.queryValue("auth") == "tok")
        let list = try e.fetchAllAppContextObjects(user: false, filter: #"name LIKE "a*""#, sort: ["name:asc", "updated:desc"],
                                                   limit: 10, page: .previous("MTA"))
        #expect(list.path == "/v2/objects/sub/channels" && list.queryValue("sort") == "name:asc,updated:desc")
        #expect(list.queryValue("end") == "MTA" && list.queryValue("start") == nil && list.queryValue("limit") == "10")
        #expect(list.queryValue("filter") == #"name LIKE "a*""# && list.queryValue("include") == "custom,status,type,totalCount")
        let manage = try e.appContextMemberships(ofUser: true, id: "me", set: [MembershipUpdate("c1", status: "s")], delete: ["c2"])
        #expect(manage.method == .patch && manage.operation == .setMemberships && manage.path == "/v2/objects/sub/uuids/me/channels")
        #expect(manage.body.map { String(decoding: $0, as: UTF8.self) }
                == #"{"delete":[{"channel":{"id":"c2"}}],"set":[{"channel":{"id":"c1"},"status":"s"}]}"#)
        let members = try e.appContextMemberships(ofUser: false, id: "c1")
        #expect(members.method == .get && members.path == "/v2/objects/sub/channels/c1/uuids" && members.operation == .fetchChannelMembers)
        #expect(throws: RequestBuildError.self) { try e.fetchAllAppContextObjects(user: true, filter: nil, sort: [], limit: 0, page: nil) }
        #expect(throws: RequestBuildError.self) { try e.fetchAppContextObject(user: false, id: "", timeout: nil) }
    }

    @Test func decodesPubNubShapes() throws {
        let page = try ResponseDecoding.page(JSONValue(parsing: """
            {"status":200,"data":[{"id":"someuuid_with_custom","name":"some name with custom","externalId":null,"profileUrl":null,
            "email":null,"type":null,"status":null,"custom":{"key3":"val1","key4":"val2"},"updated":"2024-03-07T08:47:38.835107Z",
            "eTag":"0f3067e0988bc7ded57f36d075b98eaf"}],"totalCount":1,"next":"MQ"}
            """), ResponseDecoding.userMetadata)
        #expect(page.items == [UserMetadata(id: "someuuid_with_custom", name: "some name with custom", custom: ["key3": "val1", "key4": "val2"],
                                            updated: "2024-03-07T08:47:38.835107Z", eTag: "0f3067e0988bc7ded57f36d075b98eaf")])
        #expect(page.totalCount == 1 && page.next == .next("MQ") && page.previous == nil)

        let memberships = try ResponseDecoding.page(JSONValue(parsing: """
            {"status":200,"data":[{"channel":{"id":"otterchannel"},"updated":"2025-01-18T20:31:02.519198Z","eTag":"Afah2qS199e74QE"}],
            "next":"MQ"}
            """)) { ResponseDecoding.membership($0, userId: "someuuid") }
        #expect(memberships.items.first?.channel == ChannelMetadata(id: "otterchannel") && memberships.items.first?.user.id == "someuuid")
    }

    @Test func decodesObjectsEvents() throws {
        func event(_ payload: String) throws -> AppContextEvent? {
            ReceivedEvent(timetoken: Timetoken(17905741266592242), channel: "ch", subscription: nil, payload: try JSONValue(parsing: payload),
                          publisher: nil, meta: nil, kind: .object, customMessageType: nil).appContextEvent
        }
        let membership = try event("""
            {"source":"objects","version":"2.0","event":"set","type":"membership","data":{"channel":{"id":"ch"},
            "custom":{"role":"admin"},"eTag":"Acr+lIO/3JX93wE","updated":"2026-09-28T05:42:06.651180671Z","uuid":{"id":"probe-user-32499"}}}
            """)
        #expect(membership?.change == .set && membership?.channel == "ch")
        #expect(membership?.entity == .membership(Membership(user: UserMetadata(id: "probe-user-32499"), channel: ChannelMetadata(id: "ch"),
                                                             custom: ["role": "admin"], updated: "2026-09-28T05:42:06.651180671Z",
                                                             eTag: "Acr+lIO/3JX93wE")))
        let deleted = try event(#"{"source":"objects","version":"2.0","event":"delete","type":"uuid","data":{"id":"ch"}}"#)
        #expect(deleted?.change == .delete && deleted?.entity == .user(UserMetadata(id: "ch")))
        #expect(try event(#"{"source":"objects","version":"2.0","event":"set","type":"space","data":{"id":"x"}}"#) == nil)
        #expect(try event(#"{"source":"actions","event":"added","data":{}}"#) == nil)
    }
}
