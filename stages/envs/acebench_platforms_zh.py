"""The data and return messages of ACEBench's Chinese phone platform and Travel API (``--language zh``).

Transcribed from ACEBench at e6db74b, model_inference/multi_turn/scenarioszh/ (phone_platform/base_api.py,
message.py, reminder.py, food_services.py, travel.py; the multi_step copies differ only in comments).
The logic is that of the English classes, so :class:`stages.envs.acebench_phone.PhonePlatform` and
:class:`stages.envs.acebench_travel.TravelPlatform` play both languages and take their data and
messages from here for "zh". Upstream's Chinese data keeps four of the six inbox messages, two of the three
reminders, the users, the passwords and the flight numbers in English, as transcribed below.
"""
from __future__ import annotations

# ---- phone platform (message.py, reminder.py, food_services.py, base_api.py) ----------------------

INBOX_ZH = [
    ("USR100", "USR101", "Hey Frank, don't forget about our meeting on 2024-06-11 at 4 PM in Conference Room 1.",
     "2024-06-09"),
    ("USR101", "USR102", '你能帮我点一个"玛格丽特披萨"的外卖吗,商家是达美乐。', "2024-03-09"),
    ("USR102", "USR103", "帮我查一些喜茶有哪些奶茶外卖，买一杯便宜些的奶茶。买完以后记得回复我,回复的内容是（已经买好了）",
     "2023-12-05"),
    ("USR103", "USR102", "No problem Helen, I can assist you.", "2024-09-09"),
    ("USR104", "USR105", "Isaac, are you available for a call?", "2024-06-06"),
    ("USR105", "USR104", "Yes Jack, let's do it in 30 minutes.", "2024-01-15"),
]
REMINDERS_ZH = [
    (1001, "Doctor's Appointment", "Visit Dr. Smith for a checkup.", "2024-07-15 09:30"),
    (1002, "Team Meeting", "Monthly project review with the team.", "2024-07-17 11:00"),
    (1003, "To-do list", '首先帮Frank在"盒马生鲜"点外卖，需要定两个"生鲜大礼包"，再发短信告诉Frank：'
     '"购买商品的价格是()元"。要把括号换成实际金额，保留一位小数。', "2024-07-16 11:00"),
]
MENUS_ZH = {"达美乐": {"玛格丽特披萨": 68.0, "超级至尊披萨": 88.0},
            "米村拌饭": {"石锅拌饭": 35.0, "韩式牛肉拌饭": 45.0},
            "海底捞": {"牛肉卷": 68.0, "海鲜拼盘": 88.0},
            "喜茶": {"芝士奶茶": 25.0, "四季春奶茶": 22.0},
            "盒马生鲜": {"有机蔬菜包": 15.0, "生鲜大礼包": 99.0},
            "九田家烤肉": {"韩式烤牛肉": 128.0, "烤五花肉": 78.0}}
PHONE_TEXT_ZH = {
    "wifi_on": "wifi已经打开", "device_on": "设备已经登录",
    "send_offline": "device未登录，无法发送短信", "send_no_wifi": "wifi关闭，此时不能发送信息",
    "inbox_full": "内存容量不够了，你需要询问user删除哪一条短信。", "no_pair": "发送者或接收者不存在",
    "sent": "短信成功发送给{receiver}。",
    "delete_offline": "device未登录，无法删除短信", "no_message_id": "短信ID不存在",
    "message_deleted": "短信ID {message_id} 已成功删除。",
    "view_offline": "device未登录，无法查看短信信息", "no_sender": "发送者不存在", "no_receiver": "接收者不存在",
    "no_records": "没有找到相关的短信记录", "no_user": "用户不存在", "no_keyword": "没有找到包含关键词的短信",
    "latest_offline": "device未登录，无法获取最新发送的短信ID。", "earliest_offline": "device未登录，无法获取最早发送的短信ID",
    "no_messages": "短信记录为空", "latest_is": "最新的短信ID是 {message_id}", "earliest_is": "最早的短信ID是 {message_id}",
    "reminder_offline": "device未登录，无法查看提醒", "no_title": "没有找到标题为 '{title}' 的提醒",
    "add_offline": "device未登录，无法添加一个新的提醒", "reminders_full": "提醒容量已满，无法添加新的提醒",
    "reminder_added": "提醒 '{title}' 已成功添加",
    "remove_offline": "device未登录，无法删除指定的提醒", "no_reminder_id": "提醒ID不存在",
    "reminder_deleted": "提醒ID {reminder_id} 已成功删除", "no_reminders": "没有任何提醒",
    "notified": "提醒ID {reminder_id} 已标记为已通知", "no_reminder_keyword": "没有找到包含该关键词的提醒",
    "food_no_wifi": "wifi未打开，无法登录", "wrong_password": "密码错误", "already_in": "{username} 已经登录",
    "logged_in": "用户{username}登陆成功！", "nobody_in": "当前没有登录food platform",
    "not_in": "用户 {username} 未登录food platform", "no_merchant": "商家不存在",
    "bad_quantity": "无效的数量 {quantity} 对于商品 {product}",
    "no_product": "商品 {product} 不存在于 {merchant} 的菜单中", "too_poor": "余额不足，无法下单",
    "ordered": "外卖订单成功下单给 {merchant}，总金额为 {total} 元", "unknown_merchant": "商家 '{merchant}' 不存在",
    "no_orders": "用户没有订单记录", "no_match": "没有找到匹配的订单",
}

# ---- Travel API (travel.py) ------------------------------------------------------------------------

CITIES_ZH = {"Beijing": "北京", "Shanghai": "上海", "Nanjing": "南京", "Shenzhen": "深圳", "Xiamen": "厦门",
             "Chengdu": "成都", "Fuzhou": "福州"}  # upstream's zh flights and reservations: the same rows, these names
CABINS_ZH = ("经济舱", "商务舱")  # economy, business
AIRLINE_CANCELLED_ZH = "航空公司取消航班"  # the reason that cancels free of charge
TRAVEL_TEXT_ZH = {
    "no_direct": "没有符合条件的直达航班", "bad_login": "用户名或密码不正确", "no_id": "请提供有效的预订ID或用户ID",
    "no_transfer": "未找到符合条件的中转航班。", "auth_failed": "认证失败，请检查用户ID和密码。",
    "too_poor": "{method}余额不足，请考虑换一种支付方式",
    "booked": "预订成功，预订号：{reservation_id}，总费用：{cost}元（包含行李费用）。",
    "no_reservation": "预订未找到或用户ID不匹配。", "no_flight": "航班信息未找到。", "flight_changed": "航班号已更改。",
    "change_failed": "航班更改失败：新的航班号无效或目的地不匹配。", "cabin_paid": "舱位更改成功。已支付差价: {amount}。",
    "cabin_too_poor": "余额不足，无法支付舱位差价。", "cabin_refunded": "舱位更改成功。已退款差价: {amount}。",
    "bags_paid": "行李已增加。需支付额外费用: {amount}。", "bags_too_poor": "余额不足，无法支付额外行李费用。",
    "no_fee": "修改完成，无需额外费用。", "bad_user": "用户ID无效。", "not_yours": "预订ID无效或与该用户无关。",
    "bad_flight": "航班信息无效。", "flown": "航段已使用，无法取消。",
    "airline_cancelled": "航班已取消，您的预订将被免费取消，已退款{price}元。",
    "free_cancel": "距离出发时间超过24小时，免费取消成功，已退款{price}元。",
    "fee_cancel": "距离出发时间不足24小时，已扣除取消费{fee}元，退款{refund}元。",
}
